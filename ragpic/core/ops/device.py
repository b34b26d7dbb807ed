"""Devices and the host <-> device boundary, in one place.

Two rules keep the link path free of hidden host syncs (ARCHITECTURE.md §4.3):

- values the host must read (positions for attention bands, counts) are read from CPU
  tensors only, through :func:`host_ints`, which refuses a device tensor instead of
  silently waiting for the device;
- host data goes to an accelerator through :func:`to_device`: from pinned memory with
  ``non_blocking=True``, so the copy overlaps the kernels already queued instead of
  blocking the host on a pageable copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = ["host_ints", "normalize_device", "to_device"]


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
