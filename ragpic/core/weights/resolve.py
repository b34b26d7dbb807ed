"""What ``weights="auto"`` and an unset ``dtype`` become on this machine (docs/ARCHITECTURE.md §4.8).

On the CPU a decode step is bound by the bytes of weights it reads, and torch's weight-only
kernels are fast with bf16 activations only. So a GGUF is held quantized:

- on a CPU with native bf16 (AVX512_BF16, AMX) as torch dispatches (``ATEN_CPU_CAPABILITY``
  lowers it): ``gguf`` (the file's own Q4 blocks, the rest re-quantized to int4), computing in
  bf16 (docs/RESULTS.md, *What 4-bit weights cost in fidelity*);
- on any other CPU (AVX2): ``int8``, the model computing in fp32 and each quantized layer
  running its few decode rows through the kernel in bf16
  (:func:`~ragpic.core.weights.linear.kernel_dtype`). fp32, because oneDNN's bf16 GEMMs without
  AVX-512 make a link's or prefill's rows ~3x slower than fp32 ones; int8, because it is the
  fastest format there whose teacher-forced KL against the dequantized model stays under 0.02
  (0.0016 on the 0.5B, where ``gguf`` gives 0.027 and decodes no faster: 22-24 tok/s against
  int8's 25-27 under AVX2 emulation; docs/RESULTS.md, *The same answer on an AVX2-only CPU*).

A Hugging Face folder keeps its dense weights, in ``dtype``; on CUDA weights are dense (the
kernels here are the CPU's).
"""

from __future__ import annotations

import torch

from ragpic.core.ops.device import cpu_bf16_native
from ragpic.core.weights.formats import WeightFormat
from ragpic.errors import ConfigError

__all__ = ["resolve_weights"]


def resolve_weights(fmt: WeightFormat, *, gguf: bool, device: torch.device, dtype: torch.dtype | None,
                    cpu_bf16: bool | None = None) -> tuple[WeightFormat, torch.dtype | None, str]:
    """``(format, dtype, why)`` to load with: ``auto`` resolved (``why`` says how, "" when the
    format was given), ``dtype`` None left to the device default except under a quantized
    format, which computes in bf16 unless told otherwise (or ``auto`` chose fp32).

    Raises:
        ConfigError: ``gguf`` for a model that is not a GGUF file, or a quantized format off the CPU.
    """
    why = ""
    if fmt is WeightFormat.AUTO:
        fmt, dtype, why = _auto(gguf=gguf, device=device, dtype=dtype, cpu_bf16=cpu_bf16)
    if fmt is WeightFormat.GGUF and not gguf:
        raise ConfigError("weights='gguf' keeps a GGUF file's own blocks: model must be a .gguf file "
                          "(use weights='int8' or 'int4' to quantize a Hugging Face folder)")
    if fmt.quantized and device.type != "cpu":
        raise ConfigError(f"weights={fmt.value!r} runs on torch's CPU kernels; on {device} use weights='dense' "
                          "(or 'auto')")
    if fmt.quantized and dtype is None:
        dtype = torch.bfloat16
    return fmt, dtype, why


def _auto(*, gguf: bool, device: torch.device, dtype: torch.dtype | None,
          cpu_bf16: bool | None) -> tuple[WeightFormat, torch.dtype | None, str]:
    if device.type != "cpu":
        return WeightFormat.DENSE, dtype, f"dense on {device.type} (the weight-only kernels are the CPU's)"
    if not gguf:
        return WeightFormat.DENSE, dtype, "dense (a Hugging Face folder keeps its weights)"
    isa = torch.backends.cpu.get_cpu_capability()
    if cpu_bf16 is None:
        cpu_bf16 = cpu_bf16_native()
    if cpu_bf16 and dtype in (None, torch.bfloat16):
        return WeightFormat.GGUF, torch.bfloat16, f"gguf in bf16 ({isa} with native bf16: the file's 4-bit blocks)"
    if not cpu_bf16 and dtype in (None, torch.float32):
        return WeightFormat.INT8, torch.float32, (f"int8 in fp32 ({isa} without native bf16: fp32 links, decode "
                                                  "rows through the int8 kernel in bf16, KL <= 0.02)")
    return WeightFormat.DENSE, dtype, f"dense (dtype={dtype} was asked for)"
