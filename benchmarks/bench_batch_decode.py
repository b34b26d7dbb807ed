"""Decode throughput of one batched step vs B single-request steps (the engine's own), in process.

    python benchmarks/bench_batch_decode.py [--batch 8] [--prompt 1800] [--threads 2]

Caches are filled with random K/V (a step's cost does not depend on the values), so this
isolates what continuous batching changes: ``B`` single-token forwards (each reading every
weight) vs one ``(B, 1)`` forward (:func:`ragpic.core.batch.batched_decode_step`). Prints both
rates and the memory bound ``B (W + KV) / (W + B KV)``.
"""

from __future__ import annotations

import argparse
import time

import torch

from ragpic.core.batch import batched_decode_step
from ragpic.core.cache_fill import new_cache
from ragpic.core.decode_step import DecodeBuffers
from ragpic.core.model import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=1800)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, device="cpu")
    b, n, steps = args.batch, args.prompt, args.steps
    caches = [new_cache(lm, n + 2 * steps + 1) for _ in range(b)]
    for c in caches:
        c.key_slab.normal_()
        c.value_slab.normal_()
    with torch.inference_mode():
        bufs = [DecodeBuffers(lm, n, 2 * steps + 1) for _ in range(b)]
        for i in range(2):  # warm both paths
            bufs[0].forward(lm, caches[0], i, 5)
            batched_decode_step(lm, caches, [5] * b, [n + i] * b)
        t0 = time.perf_counter()
        for i in range(steps):
            for r in range(b):
                bufs[r].forward(lm, caches[r], 2 + i, 5)
        single = (time.perf_counter() - t0) / steps
        t0 = time.perf_counter()
        for i in range(steps):
            batched_decode_step(lm, caches, [5] * b, [n + 2 + steps + i] * b)
        batched = (time.perf_counter() - t0) / steps
    weights = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    kv = lm.kv_bytes_per_token() * n
    bound = b * (weights + kv) / (weights + b * kv)
    print(f"{b} requests, {n}-token caches, {args.threads} threads: one at a time {b / single:.1f} tok/s "
          f"({single * 1e3:.0f} ms per round), batched {b / batched:.1f} tok/s ({batched * 1e3:.0f} ms per step): "
          f"{single / batched:.2f}x (memory bound {bound:.2f}x: weights {weights / 1e6:.0f} MB, KV {kv / 1e6:.0f} MB each)")


if __name__ == "__main__":
    main()
