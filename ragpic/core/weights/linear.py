"""Weight-only quantized layers on torch's own CPU kernels (docs/ARCHITECTURE.md §4.8).

:class:`Int8Linear` holds ``(N, K)`` int8 codes and one scale per output row and runs
``aten._weight_int8pack_mm``; :class:`Int4Linear` holds 4-bit codes with a scale and a zero
point per 32 inputs of each row in the layout of ``aten._weight_int4pack_mm_for_cpu``. Both
kernels read the weight once per call, so they win where decode is bound by the bytes of
weights read (a few rows); from :data:`DENSE_FROM` rows on (:data:`INT4_DENSE_FROM` for int4,
whose dequantization costs ~4x int8's) the layer dequantizes its weight to the compute dtype and
runs the dense GEMM, which is faster there (4864x896 at 256 rows, bf16: 6.2 ms against 9.7 ms
through the int4 kernel); a layer holding its dense weight (``hold_dense``) takes the GEMM from
:data:`DENSE_FROM` rows. The kernels are fast with
bf16 activations only (fp32 falls to reference loops), so a layer keeps its scales in
:func:`kernel_dtype` and a layer of an fp32 model runs its few rows through the kernel in bf16 and
casts the result back: the fp32 model's other work (norms, attention, its link's GEMMs) stays in
fp32, which is what a CPU without native bf16 runs fastest (docs/ARCHITECTURE.md §4.8).

Dequantized weight, with ``q`` the codes and ``g = k // 32``:
int8 ``W[n, k] = q[n, k] * scale[n]``; int4 ``W[n, k] = (q[n, k] - 8) * scale[g, n] + zero[g, n]``.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

__all__ = ["DENSE_FROM", "GROUP", "INT4_DENSE_FROM", "Int4Embedding", "Int4Linear", "Int8Embedding", "Int8Linear",
           "dense_bytes", "hold_dense_weights", "kernel_dtype", "pack_block", "pack_int4", "quantize_int4",
           "quantize_int8", "unpack_int4"]

DENSE_FROM = 32  # rows per call from which a dequantized dense GEMM beats the weight-only kernel
INT4_DENSE_FROM = 128
"""The same for int4. One 4864x896 layer, bf16, 2 threads, AVX-512 (AVX512_BF16): the kernel
takes ~38 us a row (M = 96: 2.9-3.8 ms, M = 144: 5.9 ms), the GEMM ~12 us a row after a 2.7-2.9
ms dequantization of the block layout (int8's takes 0.6 ms): dense wins from ~125 rows. Under AVX2
emulation the kernel wins at every row count to 1,024 (bf16 GEMMs without AVX512_BF16 are slow),
so the bound only moves toward where each ISA wants it (``benchmarks/kernel_crossover.py``). A
link's first pass (``faithful``: each chunk's first 4 tokens and the question, ~100 rows) runs
under it; its second pass and compiles above it."""
GROUP = 32  # inputs per int4 scale and zero point: a GGUF Q4 block, the kernel's smallest group
_BLOCK_N = 64  # int4 layers need whole 64-row blocks: the largest block of any CPU layout below


def kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a weight-only layer of a model computing in ``dtype`` keeps its scales in and runs
    its kernel's activations in: bf16 for fp32 (one decode GEMV on AVX2, 4864x896: int8 x fp32
    1,494 us, int8 x bf16 143 us, dense fp32 337 us), else ``dtype``."""
    return torch.bfloat16 if dtype == torch.float32 else dtype


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N, K)`` float weight -> ``(N, K)`` int8 codes and ``(N,)`` fp32 absmax scales."""
    w = w.float()
    scale = (w.abs().amax(1) / 127).clamp_min(1e-12)
    return torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale


def quantize_int4(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(N, K)`` float weight -> ``(N, K)`` uint8 codes in 0..15, ``(K/group, N)`` fp32 scales and
    zero points (asymmetric min/max per group, as gpt-fast's int4)."""
    n, k = w.shape
    g = w.float().reshape(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp_min(1e-12)
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.uint8).reshape(n, k)
    return q, scale.t().contiguous(), (lo + 8 * scale).t().contiguous()


_PACK_ROWS = 8192  # rows packed per call: the kernel's int32 input is 4 bytes a code (2.2 GB for a 7B head)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """``(N, K)`` codes in 0..15 -> the ``(N, K/2)`` uint8 layout the CPU kernel reads.

    Packed in slices of whole 64-row blocks (the layout is per block of rows, so the slices
    concatenate to the whole): the int32 copy the packing op takes is a slice's, not the tensor's.
    """
    parts = [torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes[i:i + _PACK_ROWS].to(torch.int32).contiguous(), 1)
             for i in range(0, codes.shape[0], _PACK_ROWS)]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _unpack(packed: torch.Tensor, block: int) -> torch.Tensor:
    rows = _row_bytes(packed, block)
    return torch.cat((rows & 15, rows >> 4), dim=1).reshape(packed.shape[0], 2 * packed.shape[1])


def _row_bytes(packed: torch.Tensor, block: int) -> torch.Tensor:
    """``packed`` ``(N, K/2)`` in row order: ``(N/block, block/2, K)`` uint8, contiguous, byte
    ``(j, i, k)`` holding rows ``i`` (low nibble) and ``i + block/2`` (high) of block ``j`` (the
    layout :func:`unpack_int4` describes): one transposing copy, so later passes are contiguous."""
    n, half = packed.shape
    return packed.reshape(n // block, 2 * half, block // 2).transpose(1, 2).contiguous()


@functools.cache
def pack_block() -> int:
    """Rows per block of the CPU kernel's int4 layout, which the ISA torch dispatches to decides
    (64 with AVX-512, 32 with AVX2): found once by packing a known pattern. Part of a saved
    quantized model's key (:mod:`ragpic.core.weights.saved`): packed bytes do not move between
    machines of different ISAs."""
    codes = torch.randint(0, 16, (128, 64), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    packed = pack_int4(codes)
    for block in (64, 32, 16, 8, 4, 2):
        if torch.equal(_unpack(packed, block), codes):
            return block
    raise RuntimeError(f"torch {torch.__version__}'s CPU int4 layout ({torch.backends.cpu.get_cpu_capability()}) "
                       "is not one ragpic can read: use weights='int8' or 'dense'")


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_int4`: ``(N, K/2)`` uint8 -> ``(N, K)`` uint8 codes.

    Per block of :func:`pack_block` rows ``B`` the kernel's layout is ``(K, B/2)`` bytes, byte
    ``(k, i)`` holding row ``i`` in its low nibble and row ``i + B/2`` in its high one.
    """
    return _unpack(packed, pack_block())


class _WeightOnly(nn.Module):
    """What both quantized linears share: the kernel for a few rows, the dense GEMM from
    :data:`DENSE_FROM` rows on.

    ``hold_dense`` (set by :func:`hold_dense_weights`): keep the dense weight the first such
    forward makes, so later ones skip the dequantization. It is a copy made from the codes,
    not a buffer: the state dict and the fingerprint see the codes only.
    """

    in_features: int
    out_features: int
    hold_dense: bool = False
    dense_from: int = DENSE_FROM  # without a held dense weight
    _held: torch.Tensor | None = None

    def dense_weight(self, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def kernel(self, flat: torch.Tensor) -> torch.Tensor:
        """``(M, K)`` -> ``(M, N)`` through the weight-only kernel, in ``flat``'s dtype."""
        raise NotImplementedError

    def _dense(self, dtype: torch.dtype) -> torch.Tensor:
        held = self._held
        if held is not None and held.dtype == dtype:
            return held
        w = self.dense_weight(dtype)
        if self.hold_dense:
            self._held = w
        return w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        # a layer that holds (or is to hold) its dense weight pays no dequantization after the
        # first time, so the GEMM wins from DENSE_FROM rows, int4 too
        if flat.shape[0] < (DENSE_FROM if self.hold_dense or self._held is not None else self.dense_from):
            y = self.kernel(flat)
        else:
            y = nn.functional.linear(flat, self._dense(flat.dtype))
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def hold_dense_weights(model: nn.Module, hold: bool) -> int:
    """Make every weight-only linear layer of ``model`` keep (``hold``) or drop the dense copy of
    its weight that forwards of :data:`DENSE_FROM` rows or more run on; returns how many layers.

    Held, a link or prefill pass skips the dequantization, its largest fixed cost under
    quantized weights (~1.2 s a pass on Qwen2.5-Coder-1.5B, 2 threads; docs/RESULTS.md §24),
    for the dense weights' memory (2 bytes a weight in bf16: ~2.6 GB on the 1.5B), filled at
    each layer's first such forward. Decoding a few rows still reads the quantized codes.
    """
    layers = [m for m in model.modules() if isinstance(m, _WeightOnly)]
    for m in layers:
        m.hold_dense = hold
        if not hold:
            m._held = None
    return len(layers)


def dense_bytes(model: nn.Module, dtype: torch.dtype) -> int:
    """Bytes the dense copies of ``model``'s weight-only linears take in ``dtype`` (what holding them costs)."""
    size = torch.empty((), dtype=dtype).element_size()
    return sum(m.out_features * m.in_features * size for m in model.modules() if isinstance(m, _WeightOnly))


class Int8Linear(_WeightOnly):
    """``y = x W^T + b`` with ``W`` as int8 codes. ``(..., K)`` -> ``(..., N)`` in ``x``'s dtype.

    Buffers: ``codes`` ``(N, K)`` int8, ``scales`` ``(N,)`` in :func:`kernel_dtype`, ``bias``
    ``(N,)`` (or None) in the compute dtype.
    """

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        super().__init__()
        self.out_features, self.in_features = codes.shape
        self.register_buffer("codes", codes.contiguous())
        self.register_buffer("scales", scales.to(kernel_dtype(dtype)).contiguous())
        self.register_buffer("bias", None if bias is None else bias.to(dtype))

    def dense_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """``(N, K)`` dequantized weight."""
        return self.codes.to(dtype) * self.scales.to(dtype)[:, None]

    def kernel(self, flat: torch.Tensor) -> torch.Tensor:
        x = flat.to(self.scales.dtype).contiguous()
        return torch.ops.aten._weight_int8pack_mm(x, self.codes, self.scales).to(flat.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class Int4Linear(_WeightOnly):
    """``y = x W^T + b`` with ``W`` as 4-bit codes. ``(..., K)`` -> ``(..., N)`` in ``x``'s dtype.

    Buffers: ``packed`` ``(N, K/2)`` uint8 (:func:`pack_int4`), ``scales_zeros``
    ``(K/32, N, 2)`` in :func:`kernel_dtype`, ``bias`` ``(N,)`` or None in the compute dtype.
    """

    dense_from = INT4_DENSE_FROM

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bias: torch.Tensor | None,
                 dtype: torch.dtype):
        super().__init__()
        self.out_features, self.in_features = codes.shape
        self.register_buffer("packed", pack_int4(codes))
        self.register_buffer("scales_zeros", torch.stack((scales, zeros), -1).to(kernel_dtype(dtype)).contiguous())
        self.register_buffer("bias", None if bias is None else bias.to(dtype))

    @staticmethod
    def fits(out_features: int, in_features: int) -> bool:
        """Whether the CPU kernel takes this shape (rows in 64-row blocks, inputs in 32-groups)."""
        return out_features % _BLOCK_N == 0 and in_features % GROUP == 0

    def dense_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """``(N, K)`` dequantized weight, bit for bit ``(unpack_int4(packed) - 8) * scale + zero``
        computed in ``dtype``.

        Every forward of :attr:`dense_from` rows or more pays this once per layer (docs/RESULTS.md
        §23): one transposing copy puts the packed bytes in row order (the only strided pass), each
        nibble is cast into ``(N, K)`` contiguously as ``q - 8`` in int8 (exact), and the groups'
        scales and zeros are broadcast in place: 2.1-2.9 ms for a 4864x896 bf16 layer on 2 threads.
        """
        b = pack_block()
        n, half = self.packed.shape
        k = 2 * half
        rows = _row_bytes(self.packed, b)
        w = torch.empty(n // b, b, k, dtype=dtype, device=self.packed.device)
        w[:, : b // 2].copy_((rows & 15).view(torch.int8) - 8)
        w[:, b // 2:].copy_((rows >> 4).view(torch.int8) - 8)
        sz = self.scales_zeros.to(dtype)
        groups = w.view(n, k // GROUP, GROUP)
        groups.mul_(sz[..., 0].t().unsqueeze(-1)).add_(sz[..., 1].t().unsqueeze(-1))
        return w.view(n, k)

    def kernel(self, flat: torch.Tensor) -> torch.Tensor:
        x = flat.to(self.scales_zeros.dtype).contiguous()
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scales_zeros).to(flat.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 group {GROUP}"


class Int8Embedding(nn.Module):
    """Token embedding as int8 rows: ``(...)`` ids -> ``(..., D)`` in the compute dtype.

    Buffers: ``codes`` ``(V, D)`` int8 and ``scales`` ``(V,)``; a lookup dequantizes its rows only.
    """

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype):
        super().__init__()
        self.num_embeddings, self.embedding_dim = codes.shape
        self.dtype = dtype
        self.register_buffer("codes", codes.contiguous())
        self.register_buffer("scales", scales.to(dtype).contiguous())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.codes[ids].to(self.dtype) * self.scales[ids][..., None]


class Int4Embedding(nn.Module):
    """Token embedding as a GGUF's own 4-bit rows: ``(...)`` ids -> ``(..., D)`` in the compute dtype.

    Buffers: ``codes`` ``(V, D)`` uint8 in 0..15 (a byte each: a lookup reads a few rows), and
    ``scales``/``zeros`` ``(V, D/32)``; row ``v`` is ``(codes[v] - 8) * scale + zero`` per 32-group.
    """

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, dtype: torch.dtype):
        super().__init__()
        self.num_embeddings, self.embedding_dim = codes.shape
        self.dtype = dtype
        self.register_buffer("codes", codes.contiguous())
        self.register_buffer("scales", scales.t().to(dtype).contiguous())  # (V, D/32)
        self.register_buffer("zeros", zeros.t().to(dtype).contiguous())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        scale = self.scales[ids].repeat_interleave(GROUP, dim=-1)
        zero = self.zeros[ids].repeat_interleave(GROUP, dim=-1)
        return (self.codes[ids].to(self.dtype) - 8) * scale + zero
