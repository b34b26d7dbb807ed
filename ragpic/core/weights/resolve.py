"""What ``weights="auto"`` and an unset ``dtype`` become on this machine (docs/ARCHITECTURE.md §4.8).

The choice follows docs/RESULTS.md §17 (Qwen2.5-Coder-0.5B Q4_K_M, 2 threads, AVX-512 with
AVX512_BF16): on a CPU with native bf16 a GGUF keeps its own 4-bit blocks (the rest re-quantized to int4)
and computes in bf16, which decodes ~4x faster than the dense fp32 default it replaces at a
teacher-forced KL stated there; a Hugging Face folder keeps its dense weights, in ``dtype``.
Without native bf16 the weight-only kernels' only fast path (bf16 activations) is emulated,
so ``auto`` stays dense fp32 there; on CUDA it is dense bf16 (the kernels here are the CPU's).
"""

from __future__ import annotations

import torch

from ragpic.core.ops.device import cpu_bf16_native
from ragpic.core.weights.formats import WeightFormat
from ragpic.errors import ConfigError

__all__ = ["resolve_weights"]


def resolve_weights(fmt: WeightFormat, *, gguf: bool, device: torch.device, dtype: torch.dtype | None,
                    cpu_bf16: bool | None = None) -> tuple[WeightFormat, torch.dtype | None]:
    """``(format, dtype)`` to load with: ``auto`` resolved, ``dtype`` None left to the device
    default except under a quantized format, which computes in bf16 unless told otherwise.

    Raises:
        ConfigError: ``gguf`` for a model that is not a GGUF file, or a quantized format off the CPU.
    """
    if fmt is WeightFormat.AUTO:
        if cpu_bf16 is None:
            cpu_bf16 = device.type == "cpu" and cpu_bf16_native()
        fmt = WeightFormat.GGUF if gguf and device.type == "cpu" and cpu_bf16 and dtype in (None, torch.bfloat16) \
            else WeightFormat.DENSE
    if fmt is WeightFormat.GGUF and not gguf:
        raise ConfigError("weights='gguf' keeps a GGUF file's own blocks: model must be a .gguf file "
                          "(use weights='int8' or 'int4' to quantize a Hugging Face folder)")
    if fmt.quantized and device.type != "cpu":
        raise ConfigError(f"weights={fmt.value!r} runs on torch's CPU kernels; on {device} use weights='dense' "
                          "(or 'auto')")
    if fmt.quantized and dtype is None:
        dtype = torch.bfloat16
    return fmt, dtype
