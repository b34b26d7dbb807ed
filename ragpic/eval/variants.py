"""Method names with KV variants (``legolink-16@int8``), their compiled KV, and the prompt
builder every evaluation shares: prefix text, chunk, glue, chunk, ..., suffix text."""

from __future__ import annotations

from collections.abc import Sequence

from ragpic.cache.format.entry import round_trip as store_round_trip  # the KV a store with that quant hands back
from ragpic.core.compile import compile_chunks
from ragpic.core.kv import ChunkKV
from ragpic.core.methods import parse_method
from ragpic.core.model import LoadedModel
from ragpic.core.segments import Segment, chunk_segment, text_segment
from ragpic.errors import ConfigError
from ragpic.eval.data import GLUE

__all__ = ["DEFAULT_METHODS", "build_segments", "compile_for", "store_round_trip", "normalize_methods",
           "split_variant", "variant_key"]

DEFAULT_METHODS = ("full", "naive", "legolink-0", "legolink-1", "legolink-16", "cacheblend-15")


def split_variant(name: str) -> tuple[str, str]:
    """``"legolink-16@int8"`` -> ``("legolink-16", "int8")``: a method linking int8-stored KV
    (``@int4`` likewise)."""
    method, _, quant = name.partition("@")
    if quant not in ("", "int8", "int4"):
        raise ConfigError(f"unknown KV variant {quant!r} in method {name!r}: use '@int8' or '@int4'")
    return method, quant or "none"


def variant_key(name: str) -> str:
    """Which compiled KV a method name links: its recipe, plus the storage quantization."""
    method, quant = split_variant(name)
    recipe = parse_method(method).recipe
    return recipe if quant == "none" else f"{recipe}@{quant}"


def normalize_methods(methods: Sequence[str] | str | None, default: Sequence[str] = DEFAULT_METHODS) -> list[str]:
    """Canonical method names, ``full`` first (every fidelity measure needs it), no repeats.

    A name may end in ``@int8`` or ``@int4``: the chunks' KV then goes through the store's
    entry format (quantize, encode, decode) before linking, which measures what that storage costs.
    """
    if isinstance(methods, str):
        methods = [m for m in methods.split(",") if m.strip()]
    names = []
    for m in methods or default:
        method, quant = split_variant(m.strip())
        names.append(parse_method(method).name + ("" if quant == "none" else f"@{quant}"))
    out = ["full"] + [m for m in names if m != "full"]
    return list(dict.fromkeys(out))


def compile_for(lm: LoadedModel, chunk_ids: Sequence[Sequence[int]], methods: Sequence[str],
                memo: dict | None = None) -> dict[str, list[ChunkKV]]:
    """Compiled KV of every chunk, per variant the methods need (:func:`variant_key`).

    ``memo`` reuses identical chunks.
    """
    out = {}
    for recipe in dict.fromkeys(parse_method(split_variant(m)[0]).recipe for m in methods):
        if memo is None:
            out[recipe] = compile_chunks(lm, chunk_ids, recipe=recipe)
            continue
        keys = [(recipe, tuple(c)) for c in chunk_ids]
        missing = list(dict.fromkeys(k for k in keys if k not in memo))
        if missing:
            for k, kv in zip(missing, compile_chunks(lm, [list(k[1]) for k in missing], recipe=recipe)):
                memo[k] = kv
        out[recipe] = [memo[k] for k in keys]
    for variant in dict.fromkeys(variant_key(m) for m in methods):
        if "@" in variant:
            recipe, quant = variant.split("@")
            out[variant] = [store_round_trip(kv, quant) for kv in out[recipe]]
    return out


def build_segments(tokenizer, prefix: str, kvs: Sequence[ChunkKV], suffix: str, glue: str | None = GLUE) -> list[Segment]:
    """prefix text, chunk, glue, chunk, ..., suffix text (empty texts dropped)."""
    segs = [text_segment(tokenizer, prefix)] if prefix else []
    for i, kv in enumerate(kvs):
        if i and glue:
            segs.append(text_segment(tokenizer, glue))
        segs.append(chunk_segment(kv))
    if suffix:
        segs.append(text_segment(tokenizer, suffix))
    return segs
