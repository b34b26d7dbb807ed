"""Method names with KV variants (``legolink-16@int8``, ``qr-4-k4-h2-w-s@prev4``) and their compiled KV.

This is the evaluations' edge: the method names a command line gives are parsed here, once
(:func:`normalize_methods`, :func:`method_of`); the prompt builder every evaluation shares is
:func:`ragpic.engine.offline.prompt_segments`."""

from __future__ import annotations

from collections.abc import Sequence

from ragpic.cache.format.entry import round_trip as store_round_trip  # the KV a store with that quant hands back
from ragpic.core.kv import ChunkKV
from ragpic.core.kv_quant import KVQuant
from ragpic.core.methods import Method, parse_method
from ragpic.core.methods import split_variant as parse_variant
from ragpic.core.model import LoadedModel
from ragpic.errors import ConfigError
from ragpic.engine.offline import compile_ids, compile_ids_behind, document_contexts, prompt_segments

__all__ = ["DEFAULT_METHODS", "compile_for", "head_ids", "method_of", "normalize_methods", "opening_of",
           "prompt_segments", "split_variant", "store_round_trip", "variant_key"]

DEFAULT_METHODS = ("full", "naive", "legolink-0", "legolink-1", "legolink-16", "cacheblend-15")


def split_variant(name: str) -> tuple[str, int, KVQuant, str]:
    """``"legolink-16@head@prev4@int8"`` -> ``("legolink-16", 4, "int8", "head")``: the method, how
    many of the prompt's chunks before each chunk it was compiled behind (``@prev<m>``, 0: alone;
    docs/ARCHITECTURE.md §1.3), the storage quantization its KV went through (``@int8`` /
    ``@int4``, else ``none``) and how much of the prompt's leading text came first (``"head"``:
    all of it; ``"head<n>"``: its first ``n`` tokens; ``"chat"``: its chat opening; ``""``: none)."""
    v = parse_variant(name)
    return v._replace(quant=KVQuant(v.quant))  # still a core Variant: its fields and .tags


def method_of(name: str) -> Method:
    """The link method of a method name (its ``@`` variants dropped)."""
    return parse_method(split_variant(name)[0])


def variant_key(name: str) -> str:
    """Which compiled KV a method name links: its recipe, plus what it was compiled behind and
    the storage quantization."""
    v = split_variant(name)
    return parse_method(v.method).recipe + v.tags


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
    names = []
    for m in methods or default:
        v = split_variant(m.strip())
        names.append(parse_method(v.method).name + v.tags)
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
                memo: dict | None = None, head: Sequence[int] = (), opening: int = 0) -> dict[str, list[ChunkKV]]:
    """Compiled KV of every chunk, per variant the methods need (:func:`variant_key`). A
    ``@prev<m>`` variant compiles each chunk behind the ``m`` chunks before it in ``chunk_ids``
    (which then hold one document's chunks in order, with nothing between them in the prompt);
    ``@head`` behind ``head``, the ids of the prompt's leading text, first; ``@chat`` behind its
    first ``opening`` ids (its chat opening: :func:`opening_of`).

    ``memo`` reuses identical chunks (behind identical chunks, for ``@prev<m>``).
    """
    out = {}
    for variant in dict.fromkeys(variant_key(m).split("@int")[0] for m in methods):
        tags = variant.split("@")
        recipe, behind = tags[0], next((int(t[4:]) for t in tags if t.startswith("prev")), 0)
        tag = next((t for t in tags if t.startswith(("head", "chat"))), "")
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
            todo = [list(k[2]) for k in missing]
            kvs = (compile_ids_behind(lm, todo, [list(k[1]) for k in missing]) if behind or lead
                   else compile_ids(lm, todo, recipe))
            found = dict(zip(missing, kvs))
            if memo is not None:
                memo.update(found)
        else:
            found = {}
        out[variant] = [found[k] if k in found else memo[k] for k in keys]  # type: ignore[index]
    for variant in dict.fromkeys(variant_key(m) for m in methods):
        if "@int" in variant:
            base, quant = variant.rsplit("@", 1)
            out[variant] = [store_round_trip(kv, quant) for kv in out[base]]
    return out
