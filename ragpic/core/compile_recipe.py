"""Compile recipes: how a chunk was compiled, named in its store key (stdlib only).

``plain`` (prefilled alone, its first token at position 0), ``bos<N>`` (behind ``N`` dummy BOS
tokens, LegoLink-0's) and ``ctx<N>-<hash>`` (behind ``N`` tokens of its document's text). A link
method names the recipe its chunks must have (:attr:`ragpic.core.methods.Method.recipe`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from ragpic.errors import ConfigError

__all__ = ["LEGOLINK0_DUMMIES", "PLAIN", "context_recipe", "dummy_recipe", "links_as", "recipe_dummies"]

PLAIN = "plain"
"""Compile recipe: the chunk is prefilled alone, its first token at position 0."""

LEGOLINK0_DUMMIES = 4  # EPIC: 3 extra BOS + the tokenizer's own BOS


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

