"""Link methods and compile recipes by name (no torch: ``ragpic.Config`` validates with it).

A *method* says which prompt tokens link recomputes; a *recipe* says how a chunk was
compiled. A method names the recipe its chunks must have (LegoLink-0 needs chunks compiled
behind dummy BOS tokens; every other method links plain chunks), and the recipe is part of
a chunk's store key, so the two can never be mixed by accident.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ragpic.core.kv_quant import NAMES, KVQuant
from ragpic.errors import ConfigError

PLAIN = "plain"
"""Compile recipe: the chunk is prefilled alone, its first token at position 0."""

LEGOLINK0_DUMMIES = 4  # EPIC: 3 extra BOS + the tokenizer's own BOS

METHOD_HELP = ("use 'full', 'naive', 'legolink-<k>' (e.g. legolink-16, legolink-0), "
               "'cacheblend-<percent>' (e.g. cacheblend-15), "
               "'qr-<percent>[-k<k>][-h<hops>][-w][-s][-t<rows>]' (e.g. qr-3, qr-3-k1, qr-4-k4-h1-w-s), "
               "'qp-<percent>[-k<k>][-d<percent>][-h<hops>][-w][-s]' (e.g. qp-5, qp-5-d25, qp-10-h2) "
               "or 'auto' (the fastest calibrated recipe that keeps Config.fidelity of full's accuracy)")
QR_DEFAULT_K = 16
QP_DEFAULT_DEPTH = 0.5
"""``qp``'s probe pass runs the first half of the layers unless its name says ``-d<percent>``."""
_QUERY = re.compile(r"(qr|qp)-(\d+(?:\.\d+)?)(?:-k(\d+))?(?:-d(\d+(?:\.\d+)?))?(?:-h(\d+))?(-w)?(-s)?(?:-t(\d+))?",
                    re.ASCII)


def dummy_recipe(n: int) -> str:
    """Compile recipe name for LegoLink-0: ``n`` BOS tokens prepended, their rows dropped."""
    return f"bos{n}"


_CONTEXT = re.compile(r"ctx([1-9]\d*)-([0-9a-f]{16})", re.ASCII)


def context_recipe(context_ids: Sequence[int]) -> str:
    """Compile recipe of a chunk prefilled behind ``context_ids`` (its document's text before
    it, docs/ARCHITECTURE.md §1.3), those rows dropped: ``ctx<N>-<hash>``, ``N`` the context's
    tokens and ``hash`` 16 hex digits of the SHA-256 of its ids, so the context is part of the
    chunk's store key. An empty context is ``plain``."""
    if not len(context_ids):
        return PLAIN
    digest = hashlib.sha256(",".join(str(int(t)) for t in context_ids).encode()).hexdigest()[:16]
    return f"ctx{len(context_ids)}-{digest}"


def links_as(recipe: str) -> str:
    """The recipe a link method must name to link a chunk of ``recipe``: a chunk compiled behind
    its context (``ctx<N>-<hash>``) links as a ``plain`` one does, its rows recomputed in their
    place (docs/ARCHITECTURE.md §1.3); every other recipe is its own."""
    return PLAIN if _CONTEXT.fullmatch(recipe) else recipe


def recipe_dummies(recipe: str) -> int:
    """Rows a recipe prefills before the chunk and drops: 0 for ``plain``, ``N`` for ``bos<N>``
    (dummy tokens) and ``ctx<N>-<hash>`` (``N`` tokens of context). The chunk's first token sits
    at this position at compile: its stored ``base_position``."""
    if recipe == PLAIN:
        return 0
    if recipe.startswith("bos") and recipe[3:].isascii() and recipe[3:].isdigit():
        return int(recipe[3:])
    context = _CONTEXT.fullmatch(recipe)
    if context:
        return int(context.group(1))
    raise ConfigError(f"unknown compile recipe {recipe!r}: expected 'plain', 'bos<N>' or 'ctx<N>-<hash>'")


@dataclass(slots=True, frozen=True)
class Method:
    """A parsed link method: ``full``, ``naive``, ``legolink-<k>``, ``cacheblend-<r>``,
    ``qr-<r>[-k<k>][-h<n>][-w][-s][-t<m>]``, ``qp-<r>[-k<k>][-d<d>][-h<n>][-w][-s]`` or ``auto``.

    Attributes:
        kind: ``full``, ``naive``, ``legolink``, ``cacheblend``, ``qr`` (query-guided recompute),
            ``qp`` (its one-pass form: the question probed at shallow layers) or ``auto`` (a
            calibrated choice among the others, resolved by the engine for its model:
            :mod:`ragpic.engine.calibration`; it links nothing itself).
        k: tokens recomputed at the start of every chunk (``legolink``; ``qr``'s first pass and
            ``qp``'s fixed rows).
        ratio: fraction of chunk tokens recomputed past layer 1 (``cacheblend``), or recomputed
            in the second pass (``qr``) or added to the forward (``qp``), in (0, 1].
        depth: fraction of the layers ``qp``'s probe pass runs, in (0, 1]
            (:data:`QP_DEFAULT_DEPTH` unless the name says ``-d<percent>``); 0 for other kinds.
        hops: ``qr`` / ``qp``: rounds of second-order selection (:mod:`ragpic.core.link.hops`), 0: none.
        words: ``qr`` / ``qp`` (``-w``): the question's own rare words pick runs too, before the hops
            (:func:`~ragpic.core.link.hops.select_with_hops`).
        sentences: ``qr`` / ``qp`` (``-s``): the chunks are cut into sentence runs, not
            16-token ones (:mod:`ragpic.core.link.sentences`).
        tail: ``qr`` only: how many of the question's last rows its second pass recomputes
            (``-t<m>``; 0: all of them, the default). The rows before them keep the first
            pass's KV; when every run is chosen the whole question is recomputed, so
            ``qr-100-t<m>`` is ``full`` too.
    """

    kind: str
    k: int = 0
    ratio: float = 0.0
    depth: float = 0.0
    hops: int = 0
    words: bool = False
    sentences: bool = False
    tail: int = 0

    @property
    def name(self) -> str:
        if self.kind == "legolink":
            return f"legolink-{self.k}"
        if self.kind == "cacheblend":
            return f"cacheblend-{_percent(self.ratio)}"
        if self.kind in ("qr", "qp"):
            name = f"{self.kind}-{_percent(self.ratio)}" + ("" if self.k == QR_DEFAULT_K else f"-k{self.k}")
            name += "" if self.kind == "qr" or self.depth == QP_DEFAULT_DEPTH else f"-d{_percent(self.depth)}"
            return (name + (f"-h{self.hops}" if self.hops else "") + ("-w" if self.words else "")
                    + ("-s" if self.sentences else "") + (f"-t{self.tail}" if self.tail else ""))
        return self.kind

    @property
    def reads_attention(self) -> bool:
        """Whether linking probes the question's attention inside ragpic's attention function
        (``qr``, ``qp``): a model must run that function (:func:`ragpic.core.model.load_model`'s
        default) to link with it."""
        return self.kind in ("qr", "qp")

    @property
    def recipe(self) -> str:
        """The compile recipe the chunks this method links must have."""
        if self.kind == "auto":
            raise ConfigError("method 'auto' is resolved to a recipe by the engine for its model "
                              "(Engine.method_of): resolve it before asking for its compile recipe")
        return dummy_recipe(LEGOLINK0_DUMMIES) if self.kind == "legolink" and self.k == 0 else PLAIN


def _percent(ratio: float) -> str:
    pct = round(ratio * 100, 2)
    return str(int(pct)) if pct == int(pct) else str(pct)


def _number(text: str) -> bool:
    # isdigit() alone accepts '²' and other digits int()/float() refuse
    return text.isascii() and text.replace(".", "", 1).isdigit()


def parse_method(name: str | Method) -> Method:
    """``"legolink-16"`` -> ``Method("legolink", k=16)``; raises :class:`ConfigError` naming the choices."""
    if isinstance(name, Method):
        return name
    kind, _, arg = str(name).strip().lower().partition("-")
    if kind in ("full", "naive") and not arg:
        return Method(kind)
    if kind == "legolink" and arg.isascii() and arg.isdigit():
        return Method("legolink", k=int(arg))
    if kind == "cacheblend" and _number(arg) and 0 < float(arg) <= 100:
        return Method("cacheblend", ratio=float(arg) / 100)
    if kind == "auto" and not arg:
        return Method("auto")
    query = _QUERY.fullmatch(str(name).strip().lower())
    if query:
        kind, pct, k, depth, hops, words, sentences, tail = query.groups()
        if (0 < float(pct) <= 100 and (depth is None or kind == "qp" and 0 < float(depth) <= 100)
                and (tail is None or kind == "qr" and int(tail) > 0)):
            return Method(kind, k=int(k) if k else QR_DEFAULT_K, ratio=float(pct) / 100,
                          depth=0.0 if kind == "qr" else float(depth) / 100 if depth else QP_DEFAULT_DEPTH,
                          hops=int(hops or 0), words=bool(words), sentences=bool(sentences),
                          tail=int(tail or 0))
    raise ConfigError(f"unknown link method {name!r}: {METHOD_HELP}")


class Variant(NamedTuple):
    """An evaluation's method name, split (:func:`split_variant`). ``head``: what each chunk is
    compiled behind before its chunks: ``""`` nothing, ``"head"`` the prompt's whole leading
    text, ``"head<n>"`` its first ``n`` tokens, ``"chat"`` its chat opening."""

    method: str
    behind: int
    quant: str
    head: str

    @property
    def tags(self) -> str:
        """The variants in their one order, as a name carries them: ``"@head@prev4@int8"`` (``""``: none)."""
        return ((f"@{self.head}" if self.head else "") + (f"@prev{self.behind}" if self.behind else "")
                + ("" if self.quant == KVQuant.NONE else f"@{self.quant}"))


def split_variant(name: str) -> Variant:
    """An evaluation's method name -> ``(method, behind, quant, head)``: ``"legolink-16@head@prev4@int8"``
    -> ``("legolink-16", 4, "int8", "head")``. ``@head``: each chunk compiled behind the prompt's
    leading text (its template and instruction, as the first chunk reads it); ``@head<n>``: its
    first ``n`` tokens; ``@chat``: its chat opening (template and system line, as
    ``Config(compile_head=True)`` compiles; docs/ARCHITECTURE.md §1.3); ``@prev<m>``: behind the
    ``m`` chunks before it in the prompt (after those; 0 when absent); ``@int8`` / ``@int4``: its
    KV through the store's quantized entry format (``"none"`` when absent). Raises
    :class:`ConfigError` naming the variant and what to write instead."""
    method, *tags = name.strip().split("@")
    behind, quant, head = 0, KVQuant.NONE.value, ""
    for tag in tags:
        if (re.fullmatch(r"head([1-9][0-9]*)?|chat", tag, re.ASCII) and not head and not behind
                and quant == KVQuant.NONE):
            head = tag
        elif re.fullmatch(r"prev[1-9][0-9]*", tag, re.ASCII) and not behind and quant == KVQuant.NONE:
            behind = int(tag[4:])
        elif tag in NAMES and tag != KVQuant.NONE and quant == KVQuant.NONE:
            quant = tag
        else:
            raise ConfigError(f"unknown variant {tag!r} in method {name!r}: use '@head', '@head<n>' or '@chat' "
                              f"(chunks compiled behind the prompt's leading text, its first n tokens or its chat "
                              f"opening), '@prev<m>' (behind the m chunks before them), then '@int8' or '@int4', "
                              f"each at most once and in that order")
    if (behind or head) and parse_method(method).recipe != PLAIN:
        tag = f"@{head}" if head else f"@prev{behind}"
        raise ConfigError(f"method {name!r}: {method} links chunks compiled behind dummy tokens, so they cannot "
                          f"also be compiled behind their prompt's text: drop '{tag}'")
    return Variant(method, behind, quant, head)
