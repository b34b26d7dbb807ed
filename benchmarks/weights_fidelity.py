"""Teacher-forced KL of each weight format against the fp32-dequantized model (docs/RESULTS.md §17).

The reference is the GGUF dequantized to fp32 (``weights="dense"``, ``dtype="float32"``): it
answers each prompt greedily, and every other format is scored on that answer, token by token:
``KL(p_ref || p_format)`` at each answer position (nats, mean over positions, then prompts),
and whether its own argmax agrees with the reference's. The prompts are ragpic's needle prompts
(depths 0.25 / 0.75) and RULER's niah/vt samples, at LENGTH tokens; every prompt is run whole
(``full``), as linking is orthogonal to the weights:

    python benchmarks/weights_fidelity.py GGUF [--length N] [--json OUT] [--formats gguf:float32,int8:float32]
        [--decode-rows]

``--decode-rows`` feeds the answer one token at a time over the prompt's cache, as decode runs
(a few rows go through the weight-only kernels, in bf16 for an fp32 model: what ``auto`` runs on
a CPU without native bf16); without it the answer is one forward of many rows (the dequantized
GEMM). Under ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` the kernels run their AVX2 paths.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from ragpic.core.forward import cache_kwarg
from ragpic.core.model import load_model
from ragpic.eval.data import load_haystack
from ragpic.eval.needle import needle_chunks
from ragpic.eval.ruler_tasks import generate_sample

FORMATS = (("dense", "bfloat16"), ("gguf", None), ("int8", None), ("int4", None))
ANSWER_TOKENS = 32


def prompts(tokenizer, length: int) -> list[tuple[str, str]]:
    from importlib.resources import files

    hay = load_haystack(files("ragpic") / "data" / "haystack")
    out = []
    for depth in (0.25, 0.75):
        prefix, chunks, suffix = needle_chunks(tokenizer, hay, length, depth)
        out.append((f"needle@{depth}", prefix + "".join(chunks) + suffix))
    for task in ("niah_multikey", "vt"):
        s = generate_sample(tokenizer, hay, task, length, 0)
        out.append((f"ruler:{task}", s.prefix + "".join(c.text for c in s.chunks)
                    + s.suffix))
    return out


@torch.inference_mode()
def answer_logits(lm, ids: torch.Tensor, answer: torch.Tensor, decode_rows: bool = False) -> torch.Tensor:
    """``(A, V)`` fp32 log-probs of each answer token's position, teacher-forced: one forward of
    prompt and answer, or (``decode_rows``) the prompt, then each answer token alone over its cache."""
    if not decode_rows:
        seq = torch.cat((ids, answer))[None]
        logits = lm.model(seq, logits_to_keep=answer.numel() + 1).logits[0, :-1]
        return torch.log_softmax(logits.float(), -1)
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache()
    kw = {cache_kwarg(lm.model): cache, "use_cache": True}
    rows = [lm.model(ids[None], logits_to_keep=1, **kw).logits[0, -1]]
    for t in answer[:-1]:
        rows.append(lm.model(t.view(1, 1), **kw).logits[0, -1])
    return torch.log_softmax(torch.stack(rows).float(), -1)


def main(gguf: str, length: int = 1024, out: str | None = None, formats=FORMATS, decode_rows: bool = False) -> dict:
    torch.set_num_threads(2)
    ref = load_model(gguf, device="cpu", dtype="float32", weights="dense")
    tok = ref.tokenizer
    cases = []
    for name, text in prompts(tok, length):
        ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids[0]
        with torch.inference_mode():
            gen = ref.model.generate(ids[None], max_new_tokens=ANSWER_TOKENS, do_sample=False, min_new_tokens=ANSWER_TOKENS)
        answer = gen[0, ids.numel():]
        cases.append((name, ids, answer, answer_logits(ref, ids, answer)))
        print(f"{name}: {ids.numel()} tokens, reference answer {tok.decode(answer)[:60]!r}", file=sys.stderr)
    del ref
    rows = []
    for fmt, dtype in formats:
        t0 = time.perf_counter()
        lm = load_model(gguf, device="cpu", dtype=dtype, weights=fmt)
        kls, agree = [], []
        for name, ids, answer, ref_lp in cases:
            lp = answer_logits(lm, ids, answer, decode_rows)
            kls.append(float((ref_lp.exp() * (ref_lp - lp)).sum(-1).mean()))
            agree.append(float((lp.argmax(-1) == ref_lp.argmax(-1)).float().mean()))
        rows.append({"weights": fmt, "dtype": str(lm.dtype), "summary": lm.weights_summary,
                     "kl_mean": statistics.mean(kls), "kl_per_prompt": kls, "argmax_agreement": statistics.mean(agree),
                     "seconds": time.perf_counter() - t0})
        print(f"{fmt:>6} {str(lm.dtype):>15}  KL {rows[-1]['kl_mean']:.4f}  argmax agree {rows[-1]['argmax_agreement']:.3f}")
        del lm
    result = {"gguf": gguf, "length": length, "answer_tokens": ANSWER_TOKENS, "prompts": [c[0] for c in cases],
              "decode_rows": decode_rows, "cpu": torch.backends.cpu.get_cpu_capability(),
              "reference": "dense fp32 (the GGUF dequantized)", "rows": rows}
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def _formats(text: str) -> tuple[tuple[str, str | None], ...]:
    return tuple((f, d or None) for f, _, d in (part.partition(":") for part in text.split(",")))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python benchmarks/weights_fidelity.py", description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("length", nargs="?", type=int, default=1024, help="prompt tokens (also --length)")
    ap.add_argument("json", nargs="?", default=None, help="where to write the rows (also --json)")
    ap.add_argument("--length", dest="length_opt", type=int)
    ap.add_argument("--json", dest="json_opt")
    ap.add_argument("--formats", type=_formats, default=FORMATS, help="weights[:dtype],... (default: all four)")
    ap.add_argument("--decode-rows", action="store_true", help="the answer a token at a time, as decode runs")
    a = ap.parse_args()
    main(a.gguf, a.length_opt or a.length, a.json_opt or a.json, a.formats, a.decode_rows)
