"""What a stored entry must look like to be linked into a given model's prompt.

A checksum proves that bytes are the ones a writer wrote, not that the writer was honest: a
re-checksummed tampered payload, a relabelled text, a 1-layer KV or a wild base position all
pass it, and anyone who can write to a shared folder or Redis can write such bytes. So
before an entry is used it is held against the request: its token ids must be the
tokenization of its text, its shape the model's, its base position its recipe's. Any difference makes the entry corrupt (dropped and recompiled).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ragpic.cache.format.entry import ForeignEntry, decode
from ragpic.cache.format.keys import chunk_key, dtype_name
from ragpic.core.kv import ChunkKV
from ragpic.core.compile_recipe import recipe_dummies
from ragpic.errors import ConfigError, CorruptEntry


@dataclass(frozen=True, slots=True)
class Expected:
    """The model side of the check.

    Attributes:
        layers, kv_heads, head_dim: the KV shape ``(layers, kv_heads, T, head_dim)``.
        dtype: canonical KV dtype name (``float32`` / ``float16`` / ``bfloat16``).
        tokenize: ``text -> token ids`` exactly as compile tokenizes a chunk, or ``None``
            to skip the token check.
    """

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    tokenize: Callable[[str], Sequence[int]] | None = None


def expected_for(lm: object) -> Expected:
    """The :class:`Expected` of a loaded model (``ragpic.core.model.LoadedModel``)."""
    tok = lm.tokenizer  # type: ignore[attr-defined]
    return Expected(layers=lm.num_layers, kv_heads=lm.num_kv_heads, head_dim=lm.head_dim,  # type: ignore[attr-defined]
                    dtype=dtype_name(lm.dtype),  # type: ignore[attr-defined]
                    tokenize=lambda text: tok(text, add_special_tokens=False)["input_ids"])


def check_recipe(kv: ChunkKV) -> None:
    """The entry's base position must be its recipe's (0 for ``plain``, N for ``bosN``).

    Raises:
        CorruptEntry: naming both.
    """
    try:
        want = recipe_dummies(kv.recipe)
    except ConfigError:
        raise CorruptEntry(f"entry recipe {kv.recipe!r} is not a ragpic recipe") from None
    if kv.base_position != want:
        raise CorruptEntry(f"entry base position {kv.base_position} is not recipe {kv.recipe!r}'s {want}")


def check_expected(kv: ChunkKV, text: str, want: Expected) -> None:
    """Hold a decoded entry against the model.

    Raises:
        CorruptEntry: naming the first field that differs.
    """
    L, H, _, D = kv.keys.shape
    got = (int(L), int(H), int(D), dtype_name(kv.dtype))
    exp = (want.layers, want.kv_heads, want.head_dim, want.dtype)
    if got != exp:
        raise CorruptEntry(f"entry shape (layers, kv_heads, head_dim, dtype) {got} is not the model's {exp}")
    if want.tokenize is not None:
        ids = list(want.tokenize(text))
        if kv.token_ids.tolist() != ids:
            raise CorruptEntry(f"entry token ids ({kv.num_tokens}) are not the tokenization of its text "
                               f"({len(ids)} tokens)")


def verify_entry(key: str, data: bytes, *, fingerprint: str, verify_key: bool = True,
                 expect: Expected | None = None) -> tuple[ChunkKV, str]:
    """Decode entry bytes read for ``key`` and check them every way there is.

    Any failure to parse (including ``RecursionError`` from a deeply nested header or an
    error from torch) is reported as :class:`CorruptEntry`, so one crafted entry can never
    raise into a query: it is dropped and recompiled.

    Raises:
        CorruptEntry: with a message saying what is wrong.
    """
    try:
        kv, text = decode(data, fingerprint=fingerprint)
        if verify_key and chunk_key(fingerprint, text, kv.recipe, kv.dtype) != key:
            raise CorruptEntry("entry holds another chunk than its key names (misfiled)")
        check_recipe(kv)
        if expect is not None:
            check_expected(kv, text, expect)
    except (CorruptEntry, ForeignEntry) as exc:
        raise CorruptEntry(str(exc)) from None
    except Exception as exc:
        raise CorruptEntry(f"{type(exc).__name__}: {str(exc)[:200]}") from None
    return kv, text
