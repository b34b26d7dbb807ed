"""One chunk's KV <-> bytes: a typed, checksummed, pickle-free entry format.

An entry is a prefix, a JSON header and a payload of raw tensor bytes; their layout, and
the checks that need no tensors (:func:`read_header`, :func:`verify`), are in
:mod:`ragpic.cache.format.entry_header`. This module turns a :class:`ChunkKV` into those
bytes and back. int4 entries are decoded to float KV in the original dtype (on the host,
before the hot tier); int8 entries stay int8 (link dequantizes them on its device).

int8 (codec in :mod:`ragpic.core.kv`, whose decoder runs where KV is linked) error
bound: each row's scale ``s`` is ``absmax / 127`` rounded *up* to bf16, so
``|q| <= 127`` without clipping and every element satisfies
``|x_hat - x| <= s / 2 <= absmax / 254 * (1 + 2**-7)``. Scales are bf16 rather than fp16
(same size) because fp16 scales go subnormal for rows with ``absmax < 127 * 2**-14`` and
then lose the relative bound (measured: 1.4% of absmax at ``absmax ~ 3e-6``). Decoding
casts back to the original dtype, which adds at most half an ulp of that dtype (bf16:
``absmax / 512``; fp16 rows in fp16's subnormal range, ``|x| < 6.1e-5``, get up to ``2**-25``
absolute on top). The tested bound is ``|x_hat - x| <= absmax / 127`` for every row.

Integrity: an entry that fails :func:`~ragpic.cache.format.entry_header.verify` raises
:class:`CorruptEntry`; an entry produced for another model fingerprint raises
:class:`ForeignEntry`. Neither is ever turned into a :class:`ChunkKV`.
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch

from ragpic.core.kv_quant import parse_kv_quant
from ragpic.cache.format.entry_header import (DTYPES, FORMAT_VERSION, MAGIC, PREFIX, QUANTS, payload_layout,
                                              section_nbytes, verify)
from ragpic.cache.format.int4 import dequantize_int4, quantize_int4
from ragpic.cache.format.keys import dtype_name
from ragpic.core.kv import ChunkKV
from ragpic.core.kv import quantize_int8  # int8's codec (both halves) lives with its decoder
from ragpic.errors import CorruptEntry, ForeignEntry

if sys.byteorder != "little":  # raw tensor bytes are written in host order
    raise ImportError("ragpic KV entries are little-endian; big-endian hosts are unsupported")


def _raw(t: torch.Tensor) -> bytes | memoryview:
    if t.numel() == 0:
        return b""
    return memoryview(t.detach().cpu().contiguous().view(torch.uint8).numpy()).cast("B")


def encode(kv: ChunkKV, *, text: str, quant: str = "none") -> bytes:
    """Serialise ``kv`` (any device; fp32/fp16/bf16) and its chunk ``text`` to entry bytes.

    Raises:
        ValueError: unknown ``quant``, unsupported dtype, keys/values dtype mismatch, or
            (int8, int4) non-finite values, (int4) an odd head_dim.
    """
    quant = parse_kv_quant(quant, "quant")
    if kv.is_quantized and quant != "int8":  # int8 KV stored otherwise: as what it stands for
        kv = kv.to("cpu", kv.quant_dtype)
    if kv.keys.dtype != kv.values.dtype:
        raise ValueError(f"keys are {kv.keys.dtype} but values are {kv.values.dtype}")
    dname = dtype_name(kv.dtype)
    shape = tuple(int(s) for s in kv.keys.shape)
    tensors: dict[str, torch.Tensor] = {"token_ids": kv.token_ids.to(torch.int64)}
    if quant == "none":
        tensors["keys"], tensors["values"] = kv.keys, kv.values
    elif quant == "int4":
        tensors.update(quantize_int4(kv.keys.cpu(), kv.values.cpu()))
    elif kv.is_quantized:  # already int8 (e.g. read from an int8 store): written as it is
        tensors["keys"], tensors["key_scales"] = kv.keys, kv.key_scales
        tensors["values"], tensors["value_scales"] = kv.values, kv.value_scales
    else:
        tensors["keys"], tensors["key_scales"] = quantize_int8(kv.keys)
        tensors["values"], tensors["value_scales"] = quantize_int8(kv.values)
    layout = payload_layout(shape, kv.dtype, quant)  # type: ignore[arg-type]
    payload = bytearray(sum(section_nbytes(dt, sh) for _, dt, sh in layout))
    pos = 0
    for name, _, _ in layout:
        raw = _raw(tensors[name])
        payload[pos : pos + len(raw)] = raw
        pos += len(raw)
    header = {
        "format": "ragpic-kv", "fingerprint": kv.fingerprint, "recipe": kv.recipe,
        "dtype": dname, "shape": list(shape), "base_position": int(kv.base_position),
        "num_tokens": kv.num_tokens, "quant": quant, "text": text, "byteorder": "little",
        "payload_bytes": len(payload), "payload_sha256": hashlib.sha256(payload).hexdigest(),
    }
    hbytes = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    digest = hashlib.sha256(hbytes).digest()[:16]
    return b"".join((PREFIX.pack(MAGIC, FORMAT_VERSION, len(hbytes), digest), hbytes, payload))


def decode(data: bytes, *, fingerprint: str, device: torch.device | str = "cpu") -> tuple[ChunkKV, str]:
    """Parse and verify entry bytes; return ``(kv, text)`` with ``kv`` on ``device``.

    The tensors own their memory (one copy of the payload). int8 entries stay int8, with
    their scales and ``quant_dtype`` (the header's original dtype): link dequantizes them on
    its device, so half the bytes cross to it and the hot tier holds twice as many chunks.

    Raises:
        CorruptEntry: bad magic/version/length/checksum/shape.
        ForeignEntry: intact entry whose fingerprint is not ``fingerprint``.
    """
    header, start = verify(data)
    if header["fingerprint"] != fingerprint:
        raise ForeignEntry(
            f"entry was compiled for model fingerprint {header['fingerprint']!r}, "
            f"not {fingerprint!r}"
        )
    view = memoryview(data)[start:]
    dtype = DTYPES[header["dtype"]]
    L, H, T, D = header["shape"]
    layout = payload_layout((L, H, T, D), dtype, header["quant"])
    buf = bytearray(view)
    out: dict[str, torch.Tensor] = {}
    pos = 0
    for name, dt, sh in layout:
        n = section_nbytes(dt, sh)
        count = n // torch.empty((), dtype=dt).element_size()
        t = torch.frombuffer(buf, dtype=dt, count=count, offset=pos) if count else torch.empty(0, dtype=dt)
        out[name] = t.view(sh)
        pos += n
    int8 = header["quant"] == "int8"
    if header["quant"] == "int4":  # to float KV here: link reads float KV, the hot tier holds it
        out["keys"], out["values"] = dequantize_int4(out, dtype)
        out = {k: out[k] for k in ("token_ids", "keys", "values")}
    try:
        kv = ChunkKV(
            token_ids=out["token_ids"], keys=out["keys"], values=out["values"],
            base_position=header["base_position"], fingerprint=header["fingerprint"],
            recipe=header["recipe"], key_scales=out.get("key_scales"), value_scales=out.get("value_scales"),
            quant_dtype=dtype if int8 else None,
        )
    except ValueError as exc:
        raise CorruptEntry(f"entry tensors are inconsistent: {exc}") from None
    if torch.device(device).type != "cpu":
        kv = kv.to(device)
    return kv, header["text"]


def round_trip(kv: ChunkKV, quant: str) -> ChunkKV:
    """``kv`` as a store with ``quant`` hands it back: encoded as an entry, then decoded (on
    ``kv``'s device). ``quant="none"`` returns an exact copy."""
    back, _ = decode(encode(kv.to("cpu"), text="", quant=quant), fingerprint=kv.fingerprint)
    return back.to(kv.keys.device)
