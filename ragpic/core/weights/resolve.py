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

``hold_dense="auto"`` (:func:`resolve_hold_dense`) keeps a quantized model's dense copies, made
at each layer's first link or prefill, when they fit a quarter of the machine's memory: decode
reads the quantized weights either way, and links stop paying the dequantization.
"""

from __future__ import annotations

import os

import torch

from ragpic.core.ops.device import cpu_bf16_native
from ragpic.core.weights.formats import WeightFormat
from ragpic.errors import ConfigError

__all__ = ["HOLD_DENSE_SHARE", "machine_memory_bytes", "resolve_hold_dense", "resolve_weights"]


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


HOLD_DENSE_SHARE = 0.25
"""``hold_dense="auto"`` holds the dense copies when they take at most this share of the
machine's memory: the 0.5B's 0.9 GB and the 1.5B's 2.6 GB on a 16-24 GB machine, not a 7B's
13 GB (which would crowd out its own KV and the OS's file cache)."""


def machine_memory_bytes() -> int:
    """Physical memory, or the container's cgroup limit when that is lower (0 when unknown)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 0
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(limit).read().strip()
        except OSError:
            continue
        if text.isdigit() and (total == 0 or int(text) < total):
            total = int(text)
    return total


def resolve_hold_dense(hold: bool | str, *, quantized: bool, dense_bytes: int,
                       memory_bytes: int | None = None) -> tuple[bool, str]:
    """``(hold, why)``: whether a quantized model's layers keep their dense weights once made
    (:func:`~ragpic.core.weights.linear.hold_dense_weights`). ``"auto"`` holds them when their
    ``dense_bytes`` fit :data:`HOLD_DENSE_SHARE` of ``memory_bytes`` (default: this machine's,
    :func:`machine_memory_bytes`): a link's passes then skip dequantizing every layer, which
    on the 0.5B at 128 rows makes each layer's GEMM ~3x faster than the int4 kernel (4.5 ->
    1.5 ms, ``benchmarks/kernel_crossover.py``); ``why`` says what was chosen ("" for a given
    True or False). Nothing is held under dense weights."""
    if hold is not True and hold is not False and hold != "auto":
        raise ConfigError(f"hold_dense must be True, False or 'auto', got {hold!r}")
    if hold != "auto":
        return hold and quantized, ""
    if not quantized:
        return False, ""
    memory = machine_memory_bytes() if memory_bytes is None else memory_bytes
    gb = dense_bytes / 2**30
    if memory and dense_bytes <= HOLD_DENSE_SHARE * memory:
        return True, f"dense copies held ({gb:.1f} GB, within {HOLD_DENSE_SHARE:.0%} of {memory / 2**30:.0f} GB)"
    return False, (f"dense copies not held ({gb:.1f} GB, over {HOLD_DENSE_SHARE:.0%} of {memory / 2**30:.0f} GB: "
                   "each link pass dequantizes; hold_dense=True forces them)")
