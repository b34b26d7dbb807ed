"""Devices and the host <-> device boundary, in one place.

Two rules keep the link path free of hidden host syncs (ARCHITECTURE.md §4.3):

- values the host must read (positions for attention bands, counts) are read from CPU
  tensors only, through :func:`host_ints`, which refuses a device tensor instead of
  silently waiting for the device;
- host data goes to an accelerator through :func:`to_device`: from pinned memory with
  ``non_blocking=True``, so the copy overlaps the kernels already queued instead of
  blocking the host on a pageable copy.

It also says which dtype a device computes in by default (:func:`default_dtype`) and under
``dtype="auto"`` (:func:`auto_dtype`), from what the hardware runs natively.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = ["auto_dtype", "cpu_bf16_native", "default_dtype", "host_ints", "normalize_device", "to_device"]


def normalize_device(device: str | torch.device,
                     current_index: Callable[[str], int | None] | None = None) -> torch.device:
    """``device`` with an explicit index for accelerators: a bare ``"cuda"`` becomes ``cuda:<current>``.

    Tensors always report an indexed device (``cuda:0``), so a bare ``"cuda"`` never compares
    equal to one; normalising both sides makes ``"cuda"`` and ``"cuda:0"`` the same device.
    ``current_index(type)`` gives the backend's current device index (default: torch's, e.g.
    ``torch.cuda.current_device()``, asked only for a device without an index); it returns
    None for device types without indices (``meta``, ``mps``), which are left as they are.
    """
    device = torch.device(device)
    if device.type == "cpu" or device.index is not None:
        return device
    index = (current_index or _current_index)(device.type)
    return device if index is None else torch.device(device.type, index)


def _current_index(device_type: str) -> int | None:
    current = getattr(getattr(torch, device_type, None), "current_device", None)
    return None if current is None else int(current())


def to_device(t: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``t`` on ``device`` (and ``dtype``), copied asynchronously when it leaves the host.

    CPU -> CUDA copies go through pinned memory with ``non_blocking=True``: a pageable copy
    blocks the host until the data is staged. The pinned buffer comes from torch's caching
    host allocator, which records the copy's stream, so dropping it right away is safe.
    The dtype conversion, if any, runs on the device (after the copy: fewer bytes cross).
    Same device: no copy (``t`` itself when the dtype matches too).
    """
    if t.device != device and t.device.type == "cpu" and device.type == "cuda":
        src = t if t.is_pinned() else t.pin_memory()
        t = src.to(device, non_blocking=True)
    elif t.device != device:
        t = t.to(device)
    return t if dtype is None or t.dtype == dtype else t.to(dtype)


def host_ints(t: torch.Tensor | Sequence[int]) -> list[int]:
    """The values of a CPU int tensor (or a sequence) as Python ints.

    Raises:
        ValueError: ``t`` lives on an accelerator. Reading it would stall the host until every
            queued kernel finished; pass the CPU tensor the values came from instead.
    """
    if not isinstance(t, torch.Tensor):
        return [int(x) for x in t]
    if t.device.type != "cpu":
        raise ValueError(f"host_ints got a tensor on {t.device}: reading it would sync the device; "
                         f"pass the CPU copy the positions were made from")
    return t.tolist()


def default_dtype(device: torch.device, bf16_native: bool | None = None) -> torch.dtype:
    """fp32 on the CPU (fast and exact there); bf16 on GPUs that run it natively, else fp16.

    ``bf16_native`` (default: asked of torch) must not count emulation: T4 and V100 "support"
    bf16 through slow fp32 math kernels, where fp16 runs on tensor cores.
    """
    if device.type != "cuda":
        return torch.float32
    if bf16_native is None:
        bf16_native = _cuda_bf16_native(device)
    return torch.bfloat16 if bf16_native else torch.float16


def auto_dtype(device: torch.device, cpu_bf16: bool | None = None) -> torch.dtype:
    """``dtype="auto"``: bf16 on a CPU whose torch kernels run it natively (AVX512_BF16 or AMX
    tiles, asked of torch's own CPU probe, ``cpu_bf16``), else fp32; on CUDA as :func:`default_dtype`.

    Not the default: bf16 halves the bytes and, where the CPU has those instructions, runs the
    GEMMs ~2x faster (408 vs 188 GFLOP/s on an AVX512_BF16 EPYC), but it moves every logit by
    rounding. Without them torch emulates bf16 through fp32: 1 vs 73 GFLOP/s on an AVX2-only
    EPYC (docs/RESULTS.md §8), so "auto" stays fp32 there.
    """
    if device.type == "cuda":
        return default_dtype(device)
    if cpu_bf16 is None:
        cpu_bf16 = cpu_bf16_native()
    return torch.bfloat16 if cpu_bf16 else torch.float32


def cpu_bf16_native() -> bool:
    """Whether this CPU has bf16 dot-product instructions torch's kernels use (AVX512_BF16, AMX).

    Asks the silicon and also what torch dispatches to: under ``ATEN_CPU_CAPABILITY=avx2`` (an
    AVX2 machine emulated on an AVX-512 one) torch's kernels run the AVX2 paths even though the
    silicon has bf16, so the choice must be the AVX2 machine's."""
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return False
    probes = (getattr(torch.cpu, "_is_avx512_bf16_supported", None), getattr(torch.cpu, "_is_amx_tile_supported", None))
    return any(bool(p()) for p in probes if p is not None)


def _cuda_bf16_native(device: torch.device) -> bool:
    try:
        with torch.cuda.device(device):
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch < 2.4 has no including_emulation: ask the hardware (Ampere is sm_80)
        return torch.cuda.get_device_capability(device) >= (8, 0)
