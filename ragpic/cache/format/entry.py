"""One chunk's KV <-> bytes: a typed, checksummed, pickle-free entry format.

Layout (all integers little-endian)::

    b"RPKV" | u16 format version | u32 header length | 16-byte sha256 prefix of the header
    | header (UTF-8 JSON) | payload

The header holds the fingerprint, recipe, original dtype, shape ``[L, H, T, D]``,
base position, token count, quantisation, the chunk text, the payload length and the
sha256 of the payload. The payload is raw tensor bytes in C order, in this order:

- ``quant="none"``: token ids ``(T,)`` int64, keys ``(L, H, T, D)``, values ``(L, H, T, D)``
  in the original dtype (bf16 is written as its raw 16-bit pattern): bit-exact round trip.
- ``quant="int8"``: token ids ``(T,)`` int64, key scales ``(L, H, T)`` bf16, value scales
  ``(L, H, T)`` bf16, keys ``(L, H, T, D)`` int8, values ``(L, H, T, D)`` int8. Symmetric
  absmax quantisation per (layer, head, token) row of ``D`` values; ~0.52x the bytes of
  fp16 for ``D = 64``.
- ``quant="int4"``: token ids ``(T,)`` int64, key scales and minima ``(L, H, ceil(T/64), D)``
  bf16, value scales and minima ``(L, H, T, 1)`` bf16, keys and values ``(L, H, T, D/2)``
  uint8 (two 4-bit codes per byte): keys per channel, values per token, see
  :mod:`ragpic.cache.format.int4` (its codec, both halves, and its error bound); ~0.28x the
  bytes of fp16, 0.14x of fp32.
  Decoded to float KV in the original dtype (on the host, before the hot tier).

int8 (codec in :mod:`ragpic.core.kv`, whose decoder runs where KV is linked) error
bound: each row's scale ``s`` is ``absmax / 127`` rounded *up* to bf16, so
``|q| <= 127`` without clipping and every element satisfies
``|x_hat - x| <= s / 2 <= absmax / 254 * (1 + 2**-7)``. Scales are bf16 rather than fp16
(same size) because fp16 scales go subnormal for rows with ``absmax < 127 * 2**-14`` and
then lose the relative bound (measured: 1.4% of absmax at ``absmax ~ 3e-6``). Decoding
casts back to the original dtype, which adds at most half an ulp of that dtype (bf16:
``absmax / 512``; fp16 rows in fp16's subnormal range, ``|x| < 6.1e-5``, get up to ``2**-25``
absolute on top). The tested bound is ``|x_hat - x| <= absmax / 127`` for every row.

Integrity: the header digest and the payload sha256 catch truncation and bit flips
(:class:`CorruptEntry`); an entry produced for another model fingerprint raises
:class:`ForeignEntry`. Neither is ever turned into a :class:`ChunkKV`.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from typing import Any

import torch

from ragpic.cache.format.int4 import dequantize_int4, quantize_int4, section_shapes
from ragpic.cache.format.keys import dtype_name
from ragpic.core.kv import ChunkKV
from ragpic.core.kv import quantize_int8  # int8's codec (both halves) lives with its decoder
from ragpic.errors import CorruptEntry, ForeignEntry

MAGIC = b"RPKV"
FORMAT_VERSION = 1
QUANTS = ("none", "int8", "int4")

if sys.byteorder != "little":  # raw tensor bytes are written in host order
    raise ImportError("ragpic KV entries are little-endian; big-endian hosts are unsupported")

PREFIX = struct.Struct("<4sHI16s")  # magic, format version, header length, header digest
_MAX_HEADER = 64 * 2**20
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_REQUIRED = {
    "fingerprint": str, "recipe": str, "dtype": str, "shape": list, "base_position": int,
    "num_tokens": int, "quant": str, "text": str, "payload_bytes": int, "payload_sha256": str,
    "byteorder": str,
}


def _layout(shape: tuple[int, int, int, int], dtype: torch.dtype, quant: str) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    """Payload sections ``(name, dtype, shape)`` in order, derived from the header alone."""
    L, H, T, D = shape
    if quant == "none":
        return [("token_ids", torch.int64, (T,)), ("keys", dtype, shape), ("values", dtype, shape)]
    if quant == "int4":
        sh = section_shapes(shape)
        return [("token_ids", torch.int64, (T,))] + [
            (name, torch.bfloat16, sh[name]) for name in ("key_scales", "key_mins", "value_scales", "value_mins")
        ] + [("keys", torch.uint8, sh["keys"]), ("values", torch.uint8, sh["values"])]
    return [
        ("token_ids", torch.int64, (T,)),
        ("key_scales", torch.bfloat16, (L, H, T)),
        ("value_scales", torch.bfloat16, (L, H, T)),
        ("keys", torch.int8, shape),
        ("values", torch.int8, shape),
    ]


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n * torch.empty((), dtype=dtype).element_size()


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
    if quant not in QUANTS:
        raise ValueError(f"unknown quant {quant!r}: expected one of {QUANTS}")
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
    layout = _layout(shape, kv.dtype, quant)  # type: ignore[arg-type]
    payload = bytearray(sum(_nbytes(dt, sh) for _, dt, sh in layout))
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


def read_header(data: bytes | memoryview) -> tuple[dict[str, Any], int]:
    """Validate prefix and header of an entry; return ``(header, payload offset)``.

    Checks magic, version, header length and digest, field types and shape consistency.
    Does not check the payload or the fingerprint.

    Raises:
        CorruptEntry: with a message naming what is wrong.
    """
    view = memoryview(data)
    if len(view) < PREFIX.size:
        raise CorruptEntry(f"entry is {len(view)} bytes, shorter than the {PREFIX.size}-byte prefix (truncated)")
    magic, version, hlen, digest = PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise CorruptEntry(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}: not a ragpic KV entry")
    if version != FORMAT_VERSION:
        raise CorruptEntry(f"entry format version {version}, this ragpic reads version {FORMAT_VERSION}")
    start = PREFIX.size + hlen
    if hlen > _MAX_HEADER or start > len(view):
        raise CorruptEntry(f"header length {hlen} runs past the entry's {len(view)} bytes (truncated)")
    hbytes = view[PREFIX.size : start]
    if hashlib.sha256(hbytes).digest()[:16] != digest:
        raise CorruptEntry("header checksum mismatch: the header bytes were altered")
    try:
        header = json.loads(bytes(hbytes).decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # a matching digest proves nothing: anyone can re-hash
        raise CorruptEntry(f"header is not valid JSON: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(header, dict):
        raise CorruptEntry(f"header is a JSON {type(header).__name__}, not an object")
    for field, typ in _REQUIRED.items():
        if not isinstance(header.get(field), typ) or isinstance(header.get(field), bool):
            raise CorruptEntry(f"header field {field!r} missing or not {typ.__name__}")
    shape = header["shape"]
    if len(shape) != 4 or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise CorruptEntry(f"header shape {shape} is not 4 non-negative ints (L, H, T, D)")
    if header["num_tokens"] != shape[2]:
        raise CorruptEntry(f"header says {header['num_tokens']} tokens but shape holds {shape[2]}")
    if header["dtype"] not in _DTYPES or header["quant"] not in QUANTS:
        raise CorruptEntry(f"header dtype {header['dtype']!r} / quant {header['quant']!r} unsupported")
    if header["byteorder"] != "little":
        raise CorruptEntry(f"entry byte order {header['byteorder']!r} unsupported")
    return header, start


def payload_size(header: dict[str, Any]) -> int:
    """Payload bytes implied by a validated header's shape, dtype and quant.

    Raises:
        CorruptEntry: the header's ``payload_bytes`` disagrees.
    """
    layout = _layout(tuple(header["shape"]), _DTYPES[header["dtype"]], header["quant"])  # type: ignore[arg-type]
    expected = sum(_nbytes(dt, sh) for _, dt, sh in layout)
    if header["payload_bytes"] != expected:
        raise CorruptEntry(f"header payload length {header['payload_bytes']} != {expected} implied by shape")
    return expected


def verify(data: bytes | memoryview) -> tuple[dict[str, Any], int]:
    """Check a whole entry (header, payload length and sha256) without building tensors;
    return ``(header, payload offset)``.

    Raises:
        CorruptEntry: with a message naming what is wrong.
    """
    header, start = read_header(data)
    view = memoryview(data)[start:]
    expected = payload_size(header)
    if len(view) != expected:
        raise CorruptEntry(f"payload is {len(view)} bytes, header says {expected} (truncated or padded)")
    if hashlib.sha256(view).hexdigest() != header["payload_sha256"]:
        raise CorruptEntry("payload checksum mismatch: the tensor bytes were altered")
    return header, start


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
    dtype = _DTYPES[header["dtype"]]
    L, H, T, D = header["shape"]
    layout = _layout((L, H, T, D), dtype, header["quant"])
    buf = bytearray(view)
    out: dict[str, torch.Tensor] = {}
    pos = 0
    for name, dt, sh in layout:
        n = _nbytes(dt, sh)
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
