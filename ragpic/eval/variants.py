"""Method names with KV variants (``legolink-16@int8``) and their compiled KV.

This is the evaluations' edge: the method names a command line gives are parsed here, once
(:func:`normalize_methods`, :func:`method_of`); the prompt builder every evaluation shares is
:func:`ragpic.engine.offline.prompt_segments`."""

from __future__ import annotations

from collections.abc import Sequence

from ragpic.cache.format.entry import round_trip as store_round_trip  # the KV a store with that quant hands back
from ragpic.core.kv import ChunkKV
from ragpic.core.kv_quant import NAMES, KVQuant
from ragpic.core.methods import Method, parse_method
from ragpic.core.model import LoadedModel
from ragpic.engine.offline import compile_ids, prompt_segments
from ragpic.errors import ConfigError

__all__ = ["DEFAULT_METHODS", "compile_for", "method_of", "normalize_methods", "prompt_segments", "split_variant",
           "store_round_trip", "variant_key"]

DEFAULT_METHODS = ("full", "naive", "legolink-0", "legolink-1", "legolink-16", "cacheblend-15")


def split_variant(name: str) -> tuple[str, str]:
    """``"legolink-16@int8"`` -> ``("legolink-16", "int8")``: a method linking int8-stored KV
    (``@int4`` likewise)."""
    method, _, quant = name.partition("@")
    if quant and (quant not in NAMES or quant == KVQuant.NONE):
        raise ConfigError(f"unknown KV variant {quant!r} in method {name!r}: use '@int8' or '@int4'")
    return method, KVQuant(quant or "none")


def method_of(name: str) -> Method:
    """The link method of a method name (its ``@int8``/``@int4`` variant dropped)."""
    return parse_method(split_variant(name)[0])


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
            out[recipe] = compile_ids(lm, chunk_ids, recipe)
            continue
        keys = [(recipe, tuple(c)) for c in chunk_ids]
        missing = list(dict.fromkeys(k for k in keys if k not in memo))
        if missing:
            for k, kv in zip(missing, compile_ids(lm, [list(k[1]) for k in missing], recipe)):
                memo[k] = kv
        out[recipe] = [memo[k] for k in keys]
    for variant in dict.fromkeys(variant_key(m) for m in methods):
        if "@" in variant:
            recipe, quant = variant.split("@")
            out[variant] = [store_round_trip(kv, quant) for kv in out[recipe]]
    return out
