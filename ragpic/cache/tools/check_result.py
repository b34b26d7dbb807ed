"""What ``ragpic store check`` found, and how it reads on a terminal (see :mod:`ragpic.cache.tools.check`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ragpic.cache.format.entry_header import CorruptEntry, verify
from ragpic.cache.format.keys import chunk_key


@dataclass(slots=True)
class CheckResult:
    """Counts found by :func:`check_store` (before any repair)."""

    target: str
    kind: str
    entries: int = 0
    bytes: int = 0
    corrupt: int = 0
    orphans: int = 0
    orphan_bytes: int = 0
    uncatalogued: int = 0
    stale_rows: int = 0
    repaired: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.corrupt or self.orphans or self.uncatalogued or self.stale_rows)

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"clean": self.clean}


def verify_keyed(key: str, data: bytes) -> None:
    """Verify entry bytes and that they hash to ``key``.

    Raises:
        CorruptEntry: naming what is wrong.
    """
    header, _ = verify(data)
    if chunk_key(header["fingerprint"], header["text"], header["recipe"], header["dtype"]) != key:
        raise CorruptEntry("entry holds another chunk than its key names (misfiled)")


def format_result(r: CheckResult) -> str:
    """A few lines for a terminal."""
    state = "repaired" if r.repaired and not r.clean else ("clean" if r.clean else "needs repair (--repair)")
    lines = [f"{r.kind} store {r.target}: {state}",
             f"  entries       {r.entries} intact ({r.bytes:,} bytes)",
             f"  corrupt       {r.corrupt}",
             f"  orphaned      {r.orphans} ({r.orphan_bytes:,} bytes)",
             f"  uncatalogued  {r.uncatalogued}",
             f"  stale rows    {r.stale_rows}"]
    lines += [f"  note: {n}" for n in r.notes]
    return "\n".join(lines)
