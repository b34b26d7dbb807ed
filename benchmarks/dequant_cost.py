"""What one forward of a link pays before any row: dequantizing every weight-only layer (docs/RESULTS.md §23).

A forward of at least ``DENSE_FROM`` rows (every link pass, compile, a ``full`` prefill) runs
each quantized layer as a dense GEMM on its dequantized weight (``core/weights/linear.py``), so
each pass of a link pays the dequantization of every layer it goes through, whatever its row
count. This times that cost alone: every ``Int4Linear`` / ``Int8Linear`` of the model except
the LM head (a link computes logits for one row, through the weight-only kernel),
``dense_weight`` in the compute dtype, medians of REPEATS sweeps, one thread count:

    python benchmarks/dequant_cost.py GGUF [THREADS] [REPEATS] [JSON]

Run it at two commits to compare dequantization code; ``ragpic bench`` gives the link times
around it.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from ragpic.core.model import load_model
from ragpic.core.weights.linear import Int4Linear, Int8Linear


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    gguf = sys.argv[1]
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    torch.set_num_threads(threads)
    lm = load_model(gguf, dtype=torch.bfloat16, weights="gguf")
    head = lm.model.get_output_embeddings()
    layers = [m for m in lm.model.modules() if isinstance(m, (Int4Linear, Int8Linear)) and m is not head]
    params = sum(m.in_features * m.out_features for m in layers)
    sweeps = []
    for r in range(repeats + 1):  # the first sweep warms the allocator and is dropped
        t = time.perf_counter()
        for m in layers:
            m.dense_weight(lm.dtype)
        if r:
            sweeps.append(time.perf_counter() - t)
    result = {"model": gguf, "cpu": torch.backends.cpu.get_cpu_capability(), "threads": threads,
              "layers": len(layers), "params": params, "seconds_median": statistics.median(sweeps),
              "seconds": sweeps}
    print(f"{len(layers)} quantized layers, {params / 1e9:.3f} G weights, {threads} threads: "
          f"{result['seconds_median']:.3f} s per forward's dequantization (median of {repeats}; "
          f"{params * 2 / result['seconds_median'] / 1e9:.1f} GB/s of bf16 written)")
    if len(sys.argv) > 4:
        with open(sys.argv[4], "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
