"""Content-addressed keys for compiled chunk KV.

A chunk's identity is the exact string that lands in the prompt (its token ids come from
that string), the model fingerprint, the compile recipe and the KV dtype (ARCHITECTURE.md
§4.4). It is *not* the chunk's position: the same chunk behind any prefix maps to the same
key, which is what makes the store position independent and lets several processes or
machines share hits.
"""

from __future__ import annotations

import hashlib
import struct

import torch

_DTYPE_NAMES: dict[str, str] = {
    "float32": "float32", "fp32": "float32", "float": "float32", "torch.float32": "float32",
    "float16": "float16", "fp16": "float16", "half": "float16", "torch.float16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16", "torch.bfloat16": "bfloat16",
}

_KEY_DOMAIN = b"ragpic.chunk_key.v1"


def dtype_name(dtype: str | torch.dtype) -> str:
    """Canonical name (``float32``/``float16``/``bfloat16``) of a KV dtype or one of its aliases.

    Raises:
        ValueError: for a dtype ragpic does not store (int types, fp64, unknown strings).
    """
    name = str(dtype).strip().lower()
    try:
        return _DTYPE_NAMES[name]
    except KeyError:
        raise ValueError(
            f"unsupported KV dtype {dtype!r}: expected one of float32, float16, bfloat16"
        ) from None


def chunk_key(fingerprint: str, text: str, recipe: str, kv_dtype: str | torch.dtype) -> str:
    """The store key of one compiled chunk: 64 lowercase hex chars (sha256).

    Each field is length-prefixed (u64 little-endian byte count, then its UTF-8 bytes), so
    no two different tuples can encode to the same byte string (``("ab", "c")`` vs
    ``("a", "bc")``). ``kv_dtype`` is normalised with :func:`dtype_name`, so ``"fp16"``,
    ``"float16"`` and ``torch.float16`` give the same key. ``text`` is used verbatim: no
    stripping or Unicode normalisation, because the chunk's token ids come from exactly
    this string.
    """
    h = hashlib.sha256()
    h.update(_KEY_DOMAIN)
    for field in (fingerprint, text, recipe, dtype_name(kv_dtype)):
        raw = field.encode("utf-8")
        h.update(struct.pack("<Q", len(raw)))
        h.update(raw)
    return h.hexdigest()
