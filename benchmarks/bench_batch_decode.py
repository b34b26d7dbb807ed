"""Decode throughput of one batched step vs B single-request steps (the engine's own), in process.

    python benchmarks/bench_batch_decode.py [--batch 8] [--prompt 1800] [--threads 2] [--repeats 5]

Caches are filled with random K/V (a step's cost does not depend on the values), so this
isolates what continuous batching changes: ``B`` single-token forwards (each reading every
weight) vs one ``(B, 1)`` forward (:meth:`ragpic.core.runner.ModelRunner.decode`). Prints both
rates and the memory bound ``B (W + KV) / (W + B KV)``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ragpic.core.runner import runner_for
from ragpic.core.link.plan import new_cache
from ragpic.core.decode import DecodeBuffers
from ragpic.core.model import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=1800)
    ap.add_argument("--steps", type=int, default=8, help="decode steps per timed repeat")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats (medians are reported)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, device="cpu")
    b, n, steps = args.batch, args.prompt, args.steps
    caches = [new_cache(lm, n + steps) for _ in range(b)]
    for c in caches:
        c.key_slab.normal_()
        c.value_slab.normal_()
    singles, batcheds = [], []
    with torch.inference_mode():
        bufs = [DecodeBuffers(lm, n, steps) for _ in range(b)]
        for i in range(2):  # warm both paths
            bufs[0].forward(lm, caches[0], i, 5)
            runner_for(lm).decode(torch.full((b,), 5), [n + i] * b, caches)
        # Each repeat rewrites rows n .. n + steps - 1: the same work, one-at-a-time and batched
        # back to back, so a noisy neighbour slows both sides of a ratio alike.
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for i in range(steps):
                for r in range(b):
                    bufs[r].forward(lm, caches[r], i, 5)
            singles.append((time.perf_counter() - t0) / steps)
            t0 = time.perf_counter()
            for i in range(steps):
                runner_for(lm).decode(torch.full((b,), 5), [n + i] * b, caches)
            batcheds.append((time.perf_counter() - t0) / steps)
    single, batched = statistics.median(singles), statistics.median(batcheds)
    ratio = statistics.median(s / t for s, t in zip(singles, batcheds))
    weights = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    kv = lm.kv_bytes_per_token() * n
    bound = b * (weights + kv) / (weights + b * kv)
    print(f"{b} requests, {n}-token caches, {args.threads} threads, medians of {args.repeats}: one at a time "
          f"{b / single:.1f} tok/s ({single * 1e3:.0f} ms per round), batched {b / batched:.1f} tok/s "
          f"({batched * 1e3:.0f} ms per step): {ratio:.2f}x (memory bound {bound:.2f}x: weights "
          f"{weights / 1e6:.0f} MB, KV {kv / 1e6:.0f} MB each)")


if __name__ == "__main__":
    main()
