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
               "'cacheblend-<percent>' (e.g. cacheblend-15) or 'qr-<percent>[-k<k>]' (e.g. qr-3, qr-3-k1)")
QR_DEFAULT_K = 16


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
    """A parsed link method: ``full``, ``naive``, ``legolink-<k>``, ``cacheblend-<r>``, ``qr-<r>[-k<k>]``.

    Attributes:
        kind: ``full``, ``naive``, ``legolink``, ``cacheblend`` or ``qr`` (query-guided recompute).
        k: tokens recomputed at the start of every chunk (``legolink``, and ``qr``'s first pass).
        ratio: fraction of chunk tokens recomputed past layer 1 (``cacheblend``), or recomputed
            in the second pass (``qr``), in (0, 1].
    """

    kind: str
    k: int = 0
    ratio: float = 0.0

    @property
    def name(self) -> str:
        if self.kind == "legolink":
            return f"legolink-{self.k}"
        if self.kind == "cacheblend":
            return f"cacheblend-{_percent(self.ratio)}"
        if self.kind == "qr":
            return f"qr-{_percent(self.ratio)}" + ("" if self.k == QR_DEFAULT_K else f"-k{self.k}")
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
    if kind == "qr":
        pct, sep, k = arg.partition("-k")
        if _number(pct) and 0 < float(pct) <= 100 and (not sep or k.isascii() and k.isdigit()):
            return Method("qr", k=int(k) if k else QR_DEFAULT_K, ratio=float(pct) / 100)
    raise ConfigError(f"unknown link method {name!r}: {METHOD_HELP}")
