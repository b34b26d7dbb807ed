"""Method names with KV variants (``legolink-16@int8``, ``qr-4-k4-h2-w-s@prev4``) and their compiled KV.

This is the evaluations' edge: the method names a command line gives are parsed here, once
(:func:`normalize_methods`, :func:`method_of`); the prompt builder every evaluation shares is
:func:`ragpic.engine.offline.prompt_segments`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ragpic.cache.format.entry import round_trip as store_round_trip  # the KV a store with that quant hands back
from ragpic.core.kv import ChunkKV
from ragpic.core.kv_quant import KVQuant
from ragpic.core.methods import Method, parse_variant
from ragpic.core.model import LoadedModel
from ragpic.errors import ConfigError
from ragpic.engine.compile_pipeline import ChunkJob, compile_entries
from ragpic.engine.offline import document_contexts, prompt_segments

__all__ = ["DEFAULT_METHODS", "compile_for", "head_ids", "method_of", "normalize_methods", "opening_of",
           "prompt_segments", "store_round_trip", "variant_key"]

DEFAULT_METHODS = ("full", "naive", "legolink-0", "legolink-1", "legolink-16", "cacheblend-15")


def method_of(name: str) -> Method:
    """The link method of an evaluation's method name (its ``@`` variants dropped)."""
    return parse_variant(name).method


def variant_key(name: str) -> str:
    """Which compiled KV a method name links: its compile recipe, plus what it was compiled behind
    and the storage quantization (:attr:`ragpic.core.methods.Variant.key`)."""
    return parse_variant(name).key


def normalize_methods(methods: Sequence[str] | str | None, default: Sequence[str] = DEFAULT_METHODS) -> list[str]:
    """Canonical method names, ``full`` first (every fidelity measure needs it), no repeats.

    A name may end in ``@prev<m>``: each chunk is compiled behind the ``m`` chunks before it in
    the prompt (its document, when the prompt holds one document's chunks in order: RULER's and
    the needle's do), docs/ARCHITECTURE.md §1.3. It may end in ``@int8`` or ``@int4``: the chunks'
    KV then goes through the store's entry format (quantize, encode, decode) before linking, which
    measures what that storage costs. ``@head`` (before ``@prev<m>``): each chunk is compiled
    behind the prompt's leading text first, so the first chunk's KV is ``full``'s and every
    chunk reads the prompt's own first token as its attention sink (APE's shared prefix);
    ``@head<n>``: behind its first ``n`` tokens only; ``@chat``: behind its chat opening (the
    template's start and system line, as ``Config(compile_head=True)`` compiles in order).
    """
    if isinstance(methods, str):
        methods = [m for m in methods.split(",") if m.strip()]
    names = [parse_variant(m).name for m in methods or default]
    out = ["full"] + [m for m in names if m != "full"]
    return list(dict.fromkeys(out))


def head_ids(tokenizer, prefix: str) -> list[int]:
    """The ids of a prompt's leading text as :func:`prompt_segments` tokenizes it (``@head``'s context)."""
    return tokenizer(prefix, add_special_tokens=False)["input_ids"] if prefix else []


def opening_of(tokenizer, prefix: str, before: str) -> int:
    """How many of the ids of ``prefix`` (a prompt's leading text) are those of ``before``, its
    chat opening (:func:`ragpic.eval.data.template_parts`), tokenized on its own: ``@chat``'s."""
    a, b = head_ids(tokenizer, prefix), head_ids(tokenizer, before)
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compile_for(lm: LoadedModel, chunk_ids: Sequence[Sequence[int]], methods: Sequence[str],
                memo: dict | None = None, head: Sequence[int] = (), opening: int = 0,
                batch_tokens: int = 4096) -> dict[str, list[ChunkKV]]:
    """Compiled KV of every chunk, per variant the methods need (:func:`variant_key`). A
    ``@prev<m>`` variant compiles each chunk behind the ``m`` chunks before it in ``chunk_ids``
    (which then hold one document's chunks in order, with nothing between them in the prompt);
    ``@head`` behind ``head``, the ids of the prompt's leading text, first; ``@chat`` behind its
    first ``opening`` ids (its chat opening: :func:`opening_of`).

    ``memo`` reuses identical chunks (behind identical chunks, for ``@prev<m>``). They are compiled
    by :func:`~ragpic.engine.compile_pipeline.compile_entries`, batched as ``Config().batch_tokens``.
    """
    out = {}
    exact = {v.key: v for v in (replace(parse_variant(m), quant=KVQuant.NONE) for m in methods)}
    for variant, v in exact.items():
        tag, behind = v.head, v.behind
        if tag == "chat":
            lead = list(head)[:opening]
        else:
            lead = list(head)[:int(tag[4:]) if tag[4:] else len(head)] if tag else []
        if tag and not lead:
            raise ConfigError(f"method variant {variant!r}: this evaluation's prompts have no leading text to "
                              f"compile behind: drop '@{tag}'")
        contexts = [lead + ctx for ctx in document_contexts(chunk_ids, behind)]  # nothing between chunks: no glue
        keys = [(variant, tuple(ctx), tuple(c)) for ctx, c in zip(contexts, chunk_ids)]
        missing = [k for k in dict.fromkeys(keys) if memo is None or k not in memo]
        if missing:
            place = {k: i for i, k in reversed(list(enumerate(keys)))}
            jobs = [ChunkJob(list(k[2]), f"chunk {place[k]}", context=list(k[1]) if behind or lead else None,
                             index=place[k]) for k in missing]
            kvs: list[ChunkKV] = []
            # the pipeline a store's entries come from, so calibration measures what a store holds
            # (parse_variant refused a dummy recipe behind a context)
            compile_entries(lm, jobs, v.method.recipe, batch_tokens=batch_tokens,
                            sink=lambda _, got: kvs.extend(got))
            found = dict(zip(missing, kvs))
            if memo is not None:
                memo.update(found)
        else:
            found = {}
        out[variant] = [found[k] if k in found else memo[k] for k in keys]  # type: ignore[index]
    for v in (parse_variant(m) for m in methods):
        if v.quant != KVQuant.NONE and v.key not in out:
            out[v.key] = [store_round_trip(kv, v.quant) for kv in out[replace(v, quant=KVQuant.NONE).key]]
    return out
