"""The core's tests name research recipes bare (``qr-10``, ``qp-30-k1``); the user-facing grammar
takes them only marked ``experimental:`` (docs/ARCHITECTURE.md §4.9), so they parse through here."""

from __future__ import annotations

from ragpic.core.methods import Method
from ragpic.core.methods import parse_method as _parse_method


def parse_method(name: str | Method) -> Method:
    """:func:`ragpic.core.methods.parse_method` with ``experimental=True``."""
    return _parse_method(name, experimental=True)
