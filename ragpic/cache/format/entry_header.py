"""An entry's frame: its prefix and header, checked without building tensors, and the
payload layout they imply (the tensors themselves: :mod:`ragpic.cache.format.entry`).

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

Integrity: the header digest and the payload sha256 catch truncation and bit flips
(:class:`CorruptEntry`). The backends and ``ragpic store check|stats`` read entries through
this module only: they never decode a payload.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

import torch

from ragpic.cache.format.int4 import section_shapes
from ragpic.core.kv_quant import NAMES
from ragpic.errors import CorruptEntry

MAGIC = b"RPKV"
FORMAT_VERSION = 1
QUANTS = NAMES  # the one table of KV-quant names (ragpic/core/kv_quant.py)

PREFIX = struct.Struct("<4sHI16s")  # magic, format version, header length, header digest
_MAX_HEADER = 64 * 2**20
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_REQUIRED = {
    "fingerprint": str, "recipe": str, "dtype": str, "shape": list, "base_position": int,
    "num_tokens": int, "quant": str, "text": str, "payload_bytes": int, "payload_sha256": str,
    "byteorder": str,
}


def payload_layout(shape: tuple[int, int, int, int], dtype: torch.dtype,
                   quant: str) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
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


def section_nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    """Bytes of one payload section of ``dtype`` and ``shape``."""
    n = 1
    for s in shape:
        n *= s
    return n * torch.empty((), dtype=dtype).element_size()


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
    if header["dtype"] not in DTYPES or header["quant"] not in QUANTS:
        raise CorruptEntry(f"header dtype {header['dtype']!r} / quant {header['quant']!r} unsupported")
    if header["byteorder"] != "little":
        raise CorruptEntry(f"entry byte order {header['byteorder']!r} unsupported")
    return header, start


def payload_size(header: dict[str, Any]) -> int:
    """Payload bytes implied by a validated header's shape, dtype and quant.

    Raises:
        CorruptEntry: the header's ``payload_bytes`` disagrees.
    """
    layout = payload_layout(tuple(header["shape"]), DTYPES[header["dtype"]], header["quant"])  # type: ignore[arg-type]
    expected = sum(section_nbytes(dt, sh) for _, dt, sh in layout)
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
