"""A candidate for fewer needle misses (docs/RESULTS.md §9), measured and not built: chunks
compiled behind the prompt's real head.

APE and CacheClip compile every chunk after a shared prefix instead of at position 0, so a
chunk's first tokens are not a sequence start. Here each needle-test chunk is prefilled
behind the exact head of the needle prompt (chat template, system line, instruction), the
head's rows are dropped and the chunk is linked at its place (re-rotated from base position
``len(head)``) with ``naive``, ``legolink-16`` or ``qr-10``; ``plain:`` variants link the
usual chunks compiled at position 0. Prints, per cell, each variant's needle hit and its
teacher-forced KL to ``full`` (full's greedy answer fed through the method's cache).

    python benchmarks/needle_head_prefix.py \\
        --cells 1024:0.25,2048:0.25,4096:0,4096:0.25,6144:0,6144:0.5,2048:0.5,4096:0.75 \\
        --variants plain:legolink-16,plain:qr-10,head:naive,head:legolink-16,head:qr-10 --threads 2

Results and the reason it was not built: docs/RESULTS.md §9.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import ragpic
from ragpic.core.decode import Sampling, decode_tokens
from ragpic.core.link import link
from ragpic.core.model import LoadedModel, load_model
from ragpic.eval import scoring
from ragpic.eval.data import load_haystack
from ragpic.eval.evaluate import teacher_forced_logits
from ragpic.eval.needle import KEYWORDS, needle_chunks
from ragpic.eval.variants import prompt_segments, compile_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from neighbour_compile import compile_behind  # noqa: E402  (one compile-behind-a-prefix for both benchmarks)

MAX_NEW = 32


@torch.inference_mode()
def run_cell(lm: LoadedModel, haystack: str, length: int, depth: float, variants: list[str]) -> dict[str, tuple]:
    tok = lm.tokenizer
    prefix, texts, suffix = needle_chunks(tok, haystack, length, depth, chunk_tokens=512)
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    head = tok(prefix, add_special_tokens=False)["input_ids"]
    segs = {"plain": prompt_segments(tok, prefix, compile_for(lm, ids, ["legolink-16"], {})["plain"], suffix,
                                    glue=None),
            "head": prompt_segments(tok, prefix, [compile_behind(lm, head, c) for c in ids], suffix, glue=None)}
    ref = link(lm, segs["plain"], "full", extra_capacity=MAX_NEW + 1)
    answer = list(decode_tokens(lm, ref.cache, ref.logits, ref.num_tokens, Sampling(max_new_tokens=MAX_NEW)))
    ref_tf = teacher_forced_logits(lm, ref, answer)
    out = {}
    for v in variants:
        recipe, method = v.split(":")
        res = link(lm, segs[recipe], method, extra_capacity=MAX_NEW + 1)
        kl = float(scoring.kl_divergence(ref_tf, teacher_forced_logits(lm, res, answer)).mean())
        res = link(lm, segs[recipe], method, extra_capacity=MAX_NEW + 1)  # TF rewrote rows past the prompt
        mine = list(decode_tokens(lm, res.cache, res.logits, res.num_tokens, Sampling(max_new_tokens=MAX_NEW)))
        out[v] = (scoring.needle_hit(tok.decode(mine, skip_special_tokens=True), KEYWORDS), kl)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", required=True, help="comma list of length:depth")
    p.add_argument("--variants", default="plain:legolink-16,plain:qr-10,head:naive,head:legolink-16,head:qr-10")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    variants = args.variants.split(",")
    for v in variants:
        if v.split(":")[0] not in ("plain", "head") or ":" not in v:
            p.error(f"--variants: {v!r} is not plain:<method> or head:<method>")
    lm = load_model(None)
    haystack = load_haystack(Path(ragpic.__file__).parent / "data" / "haystack")
    totals = {v: [0, 0.0] for v in variants}
    cells = [tuple(c.split(":")) for c in args.cells.split(",")]
    for length, depth in cells:
        res = run_cell(lm, haystack, int(length), float(depth), variants)
        print(f"{length:>5} {depth:<5}", " ".join(f"{v}={'H' if h else '.'}/{kl:.3f}" for v, (h, kl) in res.items()),
              flush=True)
        for v, (h, kl) in res.items():
            totals[v][0] += h
            totals[v][1] += kl
    for v, (h, kl) in totals.items():
        print(f"{v:<20} hits {h}/{len(cells)}  mean TF KL {kl / len(cells):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
