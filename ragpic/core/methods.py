"""Link methods and compile recipes by name (no torch: ``ragpic.Config`` validates with it).

A *method* says which prompt tokens link recomputes; a *recipe* says how a chunk was
compiled. A method names the recipe its chunks must have (LegoLink-0 needs chunks compiled
behind dummy BOS tokens; every other method links plain chunks), and the recipe is part of
a chunk's store key, so the two can never be mixed by accident.
"""

from __future__ import annotations

from dataclasses import dataclass

from ragpic.errors import ConfigError

PLAIN = "plain"
"""Compile recipe: the chunk is prefilled alone, its first token at position 0."""

LEGOLINK0_DUMMIES = 4  # EPIC: 3 extra BOS + the tokenizer's own BOS

METHOD_HELP = ("use 'full', 'naive', 'legolink-<k>' (e.g. legolink-16, legolink-0), "
               "'cacheblend-<percent>' (e.g. cacheblend-15), 'qr-<percent>[-k<k>]' (e.g. qr-3, qr-3-k1) "
               "or 'qp-<percent>[-k<k>][-d<percent>]' (e.g. qp-5, qp-5-d25)")
QR_DEFAULT_K = 16
QP_DEFAULT_DEPTH = 0.5
"""``qp``'s probe pass runs the first half of the layers unless its name says ``-d<percent>``."""


def dummy_recipe(n: int) -> str:
    """Compile recipe name for LegoLink-0: ``n`` BOS tokens prepended, their rows dropped."""
    return f"bos{n}"


def recipe_dummies(recipe: str) -> int:
    """Number of dummy tokens a recipe prepends (0 for ``plain``)."""
    if recipe == PLAIN:
        return 0
    if recipe.startswith("bos") and recipe[3:].isascii() and recipe[3:].isdigit():
        return int(recipe[3:])
    raise ConfigError(f"unknown compile recipe {recipe!r}: expected 'plain' or 'bos<N>'")


@dataclass(slots=True, frozen=True)
class Method:
    """A parsed link method: ``full``, ``naive``, ``legolink-<k>``, ``cacheblend-<r>``, ``qr-<r>[-k<k>]``,
    ``qp-<r>[-k<k>][-d<d>]``.

    Attributes:
        kind: ``full``, ``naive``, ``legolink``, ``cacheblend``, ``qr`` (query-guided recompute)
            or ``qp`` (its one-pass form: the question probed at shallow layers).
        k: tokens recomputed at the start of every chunk (``legolink``; ``qr``'s first pass and
            ``qp``'s fixed rows).
        ratio: fraction of chunk tokens recomputed past layer 1 (``cacheblend``), or recomputed
            in the second pass (``qr``) or added to the forward (``qp``), in (0, 1].
        depth: fraction of the layers ``qp``'s probe pass runs, in (0, 1]
            (:data:`QP_DEFAULT_DEPTH` unless the name says ``-d<percent>``); 0 for other kinds.
    """

    kind: str
    k: int = 0
    ratio: float = 0.0
    depth: float = 0.0

    @property
    def name(self) -> str:
        if self.kind == "legolink":
            return f"legolink-{self.k}"
        if self.kind == "cacheblend":
            return f"cacheblend-{_percent(self.ratio)}"
        if self.kind in ("qr", "qp"):
            name = f"{self.kind}-{_percent(self.ratio)}" + ("" if self.k == QR_DEFAULT_K else f"-k{self.k}")
            return name + ("" if self.kind == "qr" or self.depth == QP_DEFAULT_DEPTH else f"-d{_percent(self.depth)}")
        return self.kind

    @property
    def recipe(self) -> str:
        """The compile recipe the chunks this method links must have."""
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
    if kind in ("qr", "qp"):
        arg, dsep, depth = arg.partition("-d") if kind == "qp" else (arg, "", "")
        pct, sep, k = arg.partition("-k")
        depth_ok = not dsep or _number(depth) and 0 < float(depth) <= 100
        if _number(pct) and 0 < float(pct) <= 100 and (not sep or k.isascii() and k.isdigit()) and depth_ok:
            return Method(kind, k=int(k) if k else QR_DEFAULT_K, ratio=float(pct) / 100,
                          depth=0.0 if kind == "qr" else float(depth) / 100 if dsep else QP_DEFAULT_DEPTH)
    raise ConfigError(f"unknown link method {name!r}: {METHOD_HELP}")
