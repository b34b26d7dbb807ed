"""Where a quantized layer's dense GEMM starts to beat its weight-only kernel (``core/weights/linear.py``).

    python benchmarks/kernel_crossover.py [--dtype bf16|fp32] [--rows 32,64,96,128,160,192,256] [--threads 2]

One 4864x896 layer (the 0.5B's MLP) of random weights as int4 and int8: per row count, the
kernel's time against dequantizing the weight and running the GEMM, medians of 15 calls. What
``DENSE_FROM`` and ``INT4_DENSE_FROM`` were set from; run it under ``ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2`` for what an AVX2 CPU picks.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ragpic.core.weights.linear import Int4Linear, Int8Linear, quantize_int4, quantize_int8


def median_us(f, n: int = 15) -> float:
    f()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--rows", default="32,64,96,128,160,192,256")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    w = torch.randn(4864, 896, generator=torch.Generator().manual_seed(0))
    layers = {"int4": Int4Linear(*quantize_int4(w), None, dtype), "int8": Int8Linear(*quantize_int8(w), None, dtype)}
    print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, {args.threads} threads, "
          f"{args.dtype}")
    for name, layer in layers.items():
        dequant = median_us(lambda: layer.dense_weight(dtype))
        dense = layer.dense_weight(dtype)
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, 896, dtype=dtype)
            kernel = median_us(lambda: layer.kernel(x))
            gemm = median_us(lambda: torch.nn.functional.linear(x, dense))
            print(f"{name} rows {m:5d}: kernel {kernel:8.0f} us | dequantize {dequant:6.0f} + GEMM {gemm:7.0f} = "
                  f"{dequant + gemm:8.0f} us -> {'kernel' if kernel < dequant + gemm else 'dense'}")


if __name__ == "__main__":
    main()
