"""int4 layouts against exact storage: teacher-forced KL of `legolink-16` vs `full` (docs/RESULTS.md §1, int4).

The store's int4 (keys per channel over 64-token groups, values per token over all D dims)
costs +8% KL; this measures whether a finer layout or pre-RoPE keys (rotated back to position
0 before quantizing, forward again after, as KVQuant does) brings it within the 2% bar.
Each layout is quantized and dequantized in memory (the stored format's own arithmetic,
``ragpic.cache.format.int4._codes``) and linked on the same prompts as exact KV, bundled MuSiQue
questions with 192-token passages as in docs/RESULTS.md section 1:

    python benchmarks/int4_layouts.py [LIMIT] [JSON]
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time

import torch

from ragpic.cache.format.int4 import _codes
from ragpic.core.kv import ChunkKV
from ragpic.core.model import LoadedModel, load_model
from ragpic.core.kv import rotate_keys
from ragpic.eval.data import GLUE, QA_INSTRUCTION, default_dataset, load_qa, qa_chunk_ids, template_parts
from ragpic.eval.evaluate import question_scores, run_method
from ragpic.eval.variants import prompt_segments, compile_for, store_round_trip

# name -> (tokens per key group, channels per value group, quantize keys pre-RoPE)
LAYOUTS = {"int4 (k64,v64)": (64, 64, False), "int4 k32": (32, 64, False), "int4 v32": (64, 32, False),
           "int4 prerope": (64, 64, True), "int4 prerope v32": (64, 32, True),
           "int4 prerope k32 v32": (32, 32, True)}


def _round_trip(x: torch.Tensor, axis_len: int, group: int, along_tokens: bool) -> torch.Tensor:
    """Quantize and dequantize fp32 ``(L, H, T, D)`` in groups of ``group`` tokens per channel
    (``along_tokens``) or of ``group`` channels per token."""
    L, H, T, D = x.shape
    if along_tokens:
        g = -(-T // group)
        pad = g * group - T
        xp = torch.cat((x, x[:, :, -1:].expand(L, H, pad, D)), 2) if pad else x
        xg, axis = xp.view(L, H, g, group, D), 3
    else:
        xg, axis = x.view(L, H, T, D // group, group), -1
    q, s, m = _codes(xg, xg.amin(axis, keepdim=True), xg.amax(axis, keepdim=True))
    out = q.float() * s.float() + m.float()
    return out.view(L, H, -1, D)[:, :, :T] if along_tokens else out.view(L, H, T, D)


def layout_kv(lm: LoadedModel, kv: ChunkKV, kgroup: int, vgroup: int, prerope: bool) -> ChunkKV:
    """``kv`` as it would come back from an int4 store with this layout."""
    k, v = kv.keys.float(), kv.values.float()
    pos = torch.arange(kv.base_position, kv.base_position + k.shape[2])
    if prerope:
        k = rotate_keys(k, -pos, lm.inv_freq)
    kh = _round_trip(k, k.shape[2], kgroup, along_tokens=True)
    if prerope:
        kh = rotate_keys(kh, pos, lm.inv_freq)
    vh = _round_trip(v, v.shape[3], vgroup, along_tokens=False)
    return dataclasses.replace(kv, keys=kh.to(kv.keys.dtype), values=vh.to(kv.values.dtype))


def main(limit: int = 16, json_out: str | None = None) -> dict[str, float]:
    torch.set_num_threads(2)
    lm = load_model()
    before, after = template_parts(lm.tokenizer)
    per, t0 = [], time.time()
    for i, ex in enumerate(load_qa(default_dataset(), limit)):
        kvs = compile_for(lm, qa_chunk_ids(lm.tokenizer, ex, chunk_tokens=None, passage_tokens=192), ["legolink-16"])["plain"]
        prefix, suffix = before + QA_INSTRUCTION, f"{GLUE}Question: {ex.question}{after}"
        variants = {"exact": kvs, "int4 (stored)": [store_round_trip(kv, "int4") for kv in kvs]}
        variants |= {name: [layout_kv(lm, kv, *spec) for kv in kvs] for name, spec in LAYOUTS.items()}
        runs = {"full": run_method(lm, prompt_segments(lm.tokenizer, prefix, kvs, suffix, glue=GLUE), "full", 32, "self")}
        for name, kv_list in variants.items():
            runs[name] = run_method(lm, prompt_segments(lm.tokenizer, prefix, kv_list, suffix, glue=GLUE), "legolink-16", 32,
                                    runs["full"].answer_ids)
        scores = question_scores(runs, ex.answers)
        per.append({m: scores[m]["tf_kl_vs_full"] for m in variants})
        print(f"[{i + 1}] {time.time() - t0:.0f}s", {m: round(v, 3) for m, v in per[-1].items()}, flush=True)
    means = {m: statistics.mean(p[m] for p in per) for m in per[0]}
    for m, v in means.items():
        print(f"{m:22} TF KL {v:.4f}  ({100 * (v / means['exact'] - 1):+.1f}% vs exact)")
    if json_out:
        with open(json_out, "w") as f:
            json.dump({"questions": len(per), "per_question": per, "means": means}, f, indent=1)
    return means


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 16, sys.argv[2] if len(sys.argv) > 2 else None)
