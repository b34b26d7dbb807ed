"""Sizes as ``ragpic store plan`` reads and prints them: ``64GB``, ``512MiB``, a hot set of ``5%``,
``20000`` chunks or ``64GB``. Stdlib only."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["HotSet", "format_bytes", "parse_hot", "parse_size"]

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "p": 10**15, "pb": 10**15,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:e(\d+))?\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes of ``"64GB"``, ``"512MiB"``, ``"1.5TB"``, ``"4096"`` (decimal units are powers of
    1000, ``KiB``... of 1024). Raises ValueError saying what is accepted."""
    m = _SIZE.match(str(text))
    unit = m.group(3).lower() if m else None
    if not m or unit not in _UNITS:
        raise ValueError(f"expected a size such as 64GB, 512MiB or 1.5TB, got {text!r}")
    value = float(m.group(1)) * 10 ** int(m.group(2) or 0) * _UNITS[unit]
    if value < 1:
        raise ValueError(f"expected a size of at least 1 byte, got {text!r}")
    return int(value)


@dataclass(frozen=True, slots=True)
class HotSet:
    """A hot set as the user gave it: ``kind`` is ``"bytes"``, ``"chunks"`` or ``"fraction"``."""

    kind: str
    value: float
    text: str

    def chunks(self, corpus: int, entry_bytes: int) -> int:
        """How many chunks this hot set holds, for a corpus of ``corpus`` entries of ``entry_bytes``."""
        if self.kind == "bytes":
            k = int(self.value // entry_bytes)
        elif self.kind == "fraction":
            k = int(round(self.value * corpus))
        else:
            k = int(self.value)
        return max(0, min(k, corpus))


def parse_hot(text: str) -> HotSet:
    """``"5%"`` or ``"0.05"`` (a fraction of the corpus), ``"20000"`` (chunks), ``"64GB"`` (bytes)."""
    t = str(text).strip()
    try:
        if t.endswith("%"):
            v = float(t[:-1])
            if not 0 <= v <= 100:
                raise ValueError
            return HotSet("fraction", v / 100, t)
        if re.fullmatch(r"\d+", t):
            return HotSet("chunks", int(t), t)
        if re.fullmatch(r"\d*\.\d+|\d+\.\d*", t):
            v = float(t)
            if not 0 <= v <= 1:
                raise ValueError
            return HotSet("fraction", v, t)
        return HotSet("bytes", parse_size(t), t)
    except ValueError:
        raise ValueError(f"expected a percentage (5%), a fraction of the corpus (0.05), a number of chunks "
                         f"(20000) or a size (64GB), got {text!r}") from None


def format_bytes(n: float) -> str:
    """``23.6 GB``: decimal units, three significant figures."""
    for unit, scale in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"
