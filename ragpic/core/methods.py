"""Link methods by name: the one module that reads a method's spelling (no torch: ``ragpic.Config``
validates with it).

The public names are ``full``, ``naive``, ``legolink-<k>``, ``auto`` and the presets of
:data:`PRESETS` (``fast``, ``balanced``, ``faithful``). Every other recipe (query-guided ``qr-``,
its one-pass ``qp-``, ``cacheblend-``) is experimental: written ``experimental:<recipe>`` where
the public names are taken (``Config``, ``ragpic serve``, the frameworks, a request body), and
bare in the evaluations (``ragpic eval --methods``, ``ragpic calibrate --recipes``), which also
take the compile variants (``@head``, ``@prev<m>``, ``@int8``: :class:`Variant`). Each is parsed
here into fields (:class:`Method`, :class:`Variant`), and only fields travel below.

A *method* says which prompt tokens link recomputes; a *compile recipe* (``plain``, ``bos<N>``,
``ctx<N>-<hash>``: :mod:`ragpic.core.compile_recipe`) says how a chunk was compiled. A method
names the compile recipe its chunks must have, and that recipe is part of a chunk's store key,
so the two can never be mixed by accident.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType

from ragpic.core.compile_recipe import LEGOLINK0_DUMMIES, PLAIN, dummy_recipe
from ragpic.core.kv_quant import NAMES, KVQuant
from ragpic.errors import ConfigError

__all__ = ["EXPERIMENTAL", "METHOD_HELP", "RECIPE_HELP", "PRESETS", "Method", "Preset", "Variant", "parse_method", "parse_variant"]

EXPERIMENTAL = "experimental:"
"""The prefix that takes an experimental recipe where public names are asked for."""


@dataclass(slots=True, frozen=True)
class Preset:
    """A named recipe with a fixed meaning. ``recipe``: its spelling; ``what``: one line for the docs."""

    name: str
    recipe: str
    what: str


PRESETS = MappingProxyType({p.name: p for p in (
    Preset("fast", "legolink-16", "EPIC's LegoLink: each chunk's first 16 tokens and the question recomputed; "
                                  "the quickest link, and the least faithful on multi-value questions"),
    Preset("balanced", "qr-4-k4-h1-w-s", "each chunk's first 4 tokens, then the 4% of chunk sentences the question "
                                         "reads most (and one hop from them, and its rare words) recomputed"),
    Preset("faithful", "qr-8-k4-h1-w-s", "as balanced, with 8% of the chunk sentences recomputed"),
)})
"""The presets, defined here once; ``auto`` chooses among them per model (:mod:`ragpic.engine.calibration`)."""

METHOD_HELP = ("use 'auto' (the default: the fastest preset that keeps Config.fidelity of full's score on this model's "
               "calibration), a preset (" + ", ".join(PRESETS) + "), 'full', 'naive' or 'legolink-<k>' (e.g. "
               "legolink-16, legolink-0); experimental recipes are written 'experimental:<recipe>', e.g. "
               "experimental:qr-4-k4-h1-w-s")
RECIPE_HELP = ("experimental recipes: 'cacheblend-<percent>' (e.g. cacheblend-15), "
               "'qr-<percent>[-k<k>][-h<hops>][-w][-s][-t<rows>]' (e.g. qr-3, qr-3-k1, qr-4-k4-h1-w-s), "
               "'qp-<percent>[-k<k>][-d<percent>][-h<hops>][-w][-s]' (e.g. qp-5, qp-5-d25, qp-10-h2)")
"""The research grammar, said when a name was marked experimental or looks like a recipe."""
_RECIPE_START = ("qr", "qp", "cacheblend")
QR_DEFAULT_K = 16
QP_DEFAULT_DEPTH = 0.5
"""``qp``'s probe pass runs the first half of the layers unless its name says ``-d<percent>``."""
_QUERY = re.compile(r"(qr|qp)-(\d+(?:\.\d+)?)(?:-k(\d+))?(?:-d(\d+(?:\.\d+)?))?(?:-h(\d+))?(-w)?(-s)?(?:-t(\d+))?",
                    re.ASCII)
_PUBLIC_KINDS = ("full", "naive", "legolink", "auto")


@dataclass(slots=True, frozen=True)
class Method:
    """A parsed link method: ``full``, ``naive``, ``legolink-<k>``, ``auto``, or an experimental
    ``cacheblend-<r>``, ``qr-<r>[-k<k>][-h<n>][-w][-s][-t<m>]``, ``qp-<r>[-k<k>][-d<d>][-h<n>][-w][-s]``.

    Attributes:
        kind: ``full``, ``naive``, ``legolink``, ``cacheblend``, ``qr`` (query-guided recompute),
            ``qp`` (its one-pass form: the question probed at shallow layers) or ``auto`` (a
            calibrated choice among the presets, resolved by the engine for its model:
            :mod:`ragpic.engine.calibration`; it links nothing itself).
        k: tokens recomputed at the start of every chunk (``legolink``; ``qr``'s first pass and
            ``qp``'s fixed rows).
        ratio: fraction of chunk tokens recomputed past layer 1 (``cacheblend``), or recomputed
            in the second pass (``qr``) or added to the forward (``qp``), in (0, 1].
        depth: fraction of the layers ``qp``'s probe pass runs, in (0, 1]
            (:data:`QP_DEFAULT_DEPTH` unless the name says ``-d<percent>``); 0 for other kinds.
        hops: ``qr`` / ``qp``: rounds of second-order selection (:mod:`ragpic.core.link.hops`), 0: none.
        words: ``qr`` / ``qp`` (``-w``): the question's own rare words pick runs too, before the hops.
        sentences: ``qr`` / ``qp`` (``-s``): the chunks are cut into sentence runs, not 16-token
            ones (:mod:`ragpic.core.link.sentences`).
        tail: ``qr`` only: how many of the question's last rows its second pass recomputes
            (``-t<m>``; 0: all of them).
        preset: the preset this method was named by (``""``: none); not part of equality.
    """

    kind: str
    k: int = 0
    ratio: float = 0.0
    depth: float = 0.0
    hops: int = 0
    words: bool = False
    sentences: bool = False
    tail: int = 0
    preset: str = field(default="", compare=False)

    @property
    def spelled(self) -> str:
        """The recipe's own spelling, e.g. ``qr-3-k4-h1-w-s`` (a preset's too)."""
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
    def name(self) -> str:
        """What reports and ``Generation.method`` call it: the preset's name, else :attr:`spelled`."""
        return self.preset or self.spelled

    @property
    def label(self) -> str:
        """``faithful (qr-8-k4-h1-w-s)`` for a preset, else the name: what a log line says."""
        return f"{self.preset} ({self.spelled})" if self.preset else self.spelled

    @property
    def experimental(self) -> bool:
        """Whether the recipe is outside the public names (taken only as ``experimental:<recipe>``)."""
        return self.kind not in _PUBLIC_KINDS and not self.preset

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


def _grammar(text: str) -> Method | None:
    """Any recipe's spelling (lower case, no prefix) -> its fields, or ``None``."""
    if text in PRESETS:
        return replace(_grammar(PRESETS[text].recipe), preset=text)
    kind, _, arg = text.partition("-")
    if kind in ("full", "naive", "auto") and not arg:
        return Method(kind)
    if kind == "legolink" and arg.isascii() and arg.isdigit():
        return Method("legolink", k=int(arg))
    if kind == "cacheblend" and _number(arg) and 0 < float(arg) <= 100:
        return Method("cacheblend", ratio=float(arg) / 100)
    query = _QUERY.fullmatch(text)
    if query:
        kind, pct, k, depth, hops, words, sentences, tail = query.groups()
        if (0 < float(pct) <= 100 and (depth is None or kind == "qp" and 0 < float(depth) <= 100)
                and (tail is None or kind == "qr" and int(tail) > 0)):
            return Method(kind, k=int(k) if k else QR_DEFAULT_K, ratio=float(pct) / 100,
                          depth=0.0 if kind == "qr" else float(depth) / 100 if depth else QP_DEFAULT_DEPTH,
                          hops=int(hops or 0), words=bool(words), sentences=bool(sentences), tail=int(tail or 0))
    return None


def parse_method(name: str | Method, *, experimental: bool = False) -> Method:
    """``"legolink-16"`` -> ``Method("legolink", k=16)``; ``"balanced"`` -> its recipe's fields.

    A bare experimental recipe (``qr-10``) is taken only when ``experimental`` (the evaluations,
    the core's own calls); elsewhere it must be written ``experimental:qr-10``. Raises
    :class:`ConfigError` naming the choices."""
    if isinstance(name, Method):
        return name
    text = str(name).strip().lower()
    marked = text.startswith(EXPERIMENTAL)
    bare = text.removeprefix(EXPERIMENTAL).strip()
    method = _grammar(bare)
    if method is None:
        recipe = marked or experimental or bare.startswith(_RECIPE_START)
        raise ConfigError(f"unknown link method {name!r}: {METHOD_HELP}" + (f"; {RECIPE_HELP}" if recipe else ""))
    if method.experimental and not (marked or experimental):
        raise ConfigError(f"link method {name!r} is an experimental recipe: write {EXPERIMENTAL + method.spelled!r} "
                          f"to use it, or pick a public one ({', '.join(PRESETS)}, auto, full, naive, legolink-<k>)")
    return method


@dataclass(slots=True, frozen=True)
class Variant:
    """An evaluation's method with the compile variants its chunks' KV went through (:func:`parse_variant`).

    Attributes:
        method: the link method.
        behind: chunks before each chunk in the prompt it was compiled behind (``@prev<m>``; 0: alone).
        head: what each chunk was compiled behind before those: ``""`` nothing, ``"head"`` the
            prompt's whole leading text, ``"head<n>"`` its first ``n`` tokens, ``"chat"`` its
            chat opening (as ``Config(compile_head=True)`` compiles; docs/ARCHITECTURE.md §1.3).
        quant: the store's KV format its KV went through (``@int8`` / ``@int4``; ``none``: exact).
    """

    method: Method
    behind: int = 0
    head: str = ""
    quant: KVQuant = KVQuant.NONE

    @property
    def tags(self) -> str:
        """The variants in their one order, as a name carries them: ``"@head@prev4@int8"`` (``""``: none)."""
        return ((f"@{self.head}" if self.head else "") + (f"@prev{self.behind}" if self.behind else "")
                + ("" if self.quant == KVQuant.NONE else f"@{self.quant}"))

    @property
    def name(self) -> str:
        """The canonical spelling: ``qr-4-k4-h1-w-s@head@prev4``."""
        return self.method.name + self.tags

    @property
    def label(self) -> str:
        """What a log line says: ``faithful@prev4 (qr-8-k4-h1-w-s)``, or the name."""
        return self.name + (f" ({self.method.spelled})" if self.method.preset else "")

    @property
    def key(self) -> str:
        """Which compiled KV it links: the method's compile recipe plus the variants (``plain@prev4``)."""
        return self.method.recipe + self.tags

    def fields(self) -> dict:
        """Its fields as plain JSON values (what a calibration file stores)."""
        out = {f.name: getattr(self.method, f.name) for f in fields(Method)}
        return {**out, "behind": self.behind, "head": self.head, "quant": str(self.quant)}

    @classmethod
    def from_fields(cls, raw: dict) -> "Variant":
        """The inverse of :meth:`fields`, checked: the fields must be ones :func:`parse_variant`
        gives for the recipe's own spelling (a wrong type or value raises :class:`ConfigError`)."""
        known = {f.name for f in fields(Method)} | {"behind", "head", "quant"}
        if not isinstance(raw, dict) or not set(raw) <= known or not isinstance(raw.get("kind"), str):
            raise ConfigError(f"a recipe must be an object with a 'kind' and only the fields {sorted(known)}, "
                              f"got {raw!r}")
        try:
            method = Method(**{k: v for k, v in raw.items() if k in known - {"behind", "head", "quant"}})
            tags = Variant(method, raw.get("behind", 0), raw.get("head", ""), KVQuant(raw.get("quant", "none"))).tags
            parsed = parse_variant(method.spelled + tags)
        except (TypeError, ValueError) as e:  # ConfigError is a ValueError
            raise ConfigError(f"recipe fields {raw!r} do not spell a recipe ({e})") from None
        if parsed.method != method or parsed.tags != tags:
            raise ConfigError(f"recipe fields {raw!r} do not spell a recipe ragpic links (read as {parsed.name})")
        if method.preset in PRESETS and _grammar(method.preset) == method:  # still that preset's recipe
            parsed = replace(parsed, method=replace(parsed.method, preset=method.preset))
        return parsed


def parse_variant(name: str | Variant) -> Variant:
    """An evaluation's method name -> :class:`Variant`: ``"legolink-16@head@prev4@int8"`` -> the
    method, behind 4, head ``"head"``, quant int8. Takes experimental recipes bare. Raises
    :class:`ConfigError` naming the variant and what to write instead."""
    if isinstance(name, Variant):
        return name
    method, *tags = str(name).strip().split("@")
    behind, quant, head = 0, KVQuant.NONE, ""
    for tag in tags:
        if (re.fullmatch(r"head([1-9][0-9]*)?|chat", tag, re.ASCII) and not head and not behind
                and quant == KVQuant.NONE):
            head = tag
        elif re.fullmatch(r"prev[1-9][0-9]*", tag, re.ASCII) and not behind and quant == KVQuant.NONE:
            behind = int(tag[4:])
        elif tag in NAMES and tag != KVQuant.NONE and quant == KVQuant.NONE:
            quant = KVQuant(tag)
        else:
            raise ConfigError(f"unknown variant {tag!r} in method {name!r}: use '@head', '@head<n>' or '@chat' "
                              f"(chunks compiled behind the prompt's leading text, its first n tokens or its chat "
                              f"opening), '@prev<m>' (behind the m chunks before them), then '@int8' or '@int4', "
                              f"each at most once and in that order")
    m = parse_method(method, experimental=True)
    if (behind or head) and (m.kind == "auto" or m.recipe != PLAIN):
        tag = f"@{head}" if head else f"@prev{behind}"
        raise ConfigError(f"method {name!r}: {m.name} links chunks compiled behind dummy tokens, so they cannot "
                          f"also be compiled behind their prompt's text: drop '{tag}'" if m.kind != "auto" else
                          f"method {name!r}: auto names no recipe to compile: drop '{tag}' or name a method")
    return Variant(m, behind, head, quant)
