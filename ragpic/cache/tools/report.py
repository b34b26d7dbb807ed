"""``ragpic store stats PATH|URL``: what a store holds and what every process using it did.

Read-only and cheap at any size: entry count and bytes come from the folder index's totals
(Redis: each fingerprint's catalog length), bytes per token and the stored formats from the
headers of a sample of entries (keys are hashes, so the entries after a random key are a
fair sample), and hits, misses, evictions and recompiles from the counters every
:class:`ragpic.cache.ChunkStore` adds to (see :meth:`ChunkStore.flush_stats`). Never creates,
repairs or writes anything.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ragpic.cache.format.entry_header import PREFIX, CorruptEntry, read_header
from ragpic.cache.backends.kinds import store_kind
from ragpic.errors import ConfigError

__all__ = ["StoreReport", "folder_report", "format_report", "redis_report", "store_report"]

SAMPLE = 256


@dataclass(slots=True)
class StoreReport:
    """Figures of one store (see the module docstring)."""

    target: str
    kind: str
    entries: int = 0
    bytes: int | None = None  # exact for a folder; Redis: estimated from the sample
    fingerprints: dict[str, int] = field(default_factory=dict)
    sampled: int = 0
    bytes_per_token: float | None = None
    formats: dict[str, int] = field(default_factory=dict)  # quant of the sampled entries
    counters: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def hit_rate(self) -> float | None:
        hits, misses = self.counters.get("hits", 0), self.counters.get("misses", 0)
        return hits / (hits + misses) if hits + misses else None

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"hit_rate": self.hit_rate}


def _sample_figures(report: StoreReport, heads: list[tuple[dict, int]]) -> None:
    report.sampled = len(heads)
    tokens = sum(h["num_tokens"] for h, _ in heads)
    report.bytes_per_token = sum(n for _, n in heads) / tokens if tokens else None
    report.formats = dict(Counter(h["quant"] for h, _ in heads))


def store_report(spec: str, *, prefix: str = "ragpic:", sample: int = SAMPLE) -> StoreReport:
    """Figures of the folder or Redis store ``spec``.

    Raises:
        ConfigError: ``spec`` is not a store (empty, unknown scheme, memory, no such folder).
    """
    kind, target = store_kind(spec)
    report = kind.tool("report")
    if report is None:
        raise ConfigError(f"store stats needs a folder or a redis:// URL, not a {kind.name} store")
    return report(target, prefix=prefix, sample=sample)


def folder_report(target: str | os.PathLike[str], *, prefix: str = "ragpic:", sample: int = SAMPLE) -> StoreReport:
    """Figures of the store folder ``target`` (``prefix`` is unused: a folder's entries have none)."""
    from ragpic.cache.backends.disk.index_db import IndexDamaged, IndexDB
    from ragpic.cache.backends.disk.index_open import INDEX
    from ragpic.cache.backends.disk.reconcile import read_head

    root = Path(target)
    if not (root / INDEX).is_file():
        raise ConfigError(f"no KV store folder at {str(root)!r} (no {INDEX}): pass the folder given as "
                          "store= (e.g. my_index/kv)")
    report = StoreReport(target=str(root), kind="folder")
    try:
        db = IndexDB(root / INDEX, readonly=True)
    except (IndexDamaged, OSError, sqlite3.Error) as exc:
        raise ConfigError(f"{root / INDEX} is unreadable ({exc}): run `ragpic store check --repair {root}`") from exc
    try:
        report.entries, report.bytes = db.totals()
        report.fingerprints = dict(db.query("SELECT fingerprint, count(*) FROM entries GROUP BY fingerprint"))
        start = os.urandom(32).hex()
        keys = [k for (k,) in db.query("SELECT key FROM entries WHERE key >= ? ORDER BY key LIMIT ?", (start, sample))]
        keys += [k for (k,) in db.query("SELECT key FROM entries WHERE key < ? ORDER BY key LIMIT ?",
                                        (start, sample - len(keys)))]
        report.counters = db.counters()
        if not db.has_counters:
            report.notes.append("this index predates shared counters: open the store once to add them")
    finally:
        db.close()
    heads = []
    for key in keys:
        try:
            heads.append(read_head(root, key))
        except (CorruptEntry, OSError, ValueError):
            report.notes.append(f"entry {key[:12]}... is unreadable: run `ragpic store check {root}`")
    _sample_figures(report, heads)
    return report


def redis_report(url: str, *, prefix: str = "ragpic:", sample: int = SAMPLE) -> StoreReport:
    """Figures of the Redis store (or cluster) at ``url`` under ``prefix``."""
    from ragpic.cache.backends.redis.backend import RedisBackend

    backend = RedisBackend(url, prefix=prefix, timeout_s=5.0)
    report = StoreReport(target=url, kind="redis-cluster" if backend.cluster else "redis")
    try:
        r = backend.client
        names = list(r.scan_iter(match=f"{prefix}catalog:*", count=1000))
        report.fingerprints = {n.decode()[len(prefix) + len("catalog:"):]: int(r.hlen(n)) for n in names}
        report.entries = sum(report.fingerprints.values())
        keys = [k.decode() for n in names for k in (r.hrandfield(n, sample) or [])][:sample]
        heads = [h for h in (_redis_head(backend, k) for k in keys) if h is not None]
        _sample_figures(report, heads)
        if heads:
            report.bytes = round(report.entries * sum(n for _, n in heads) / len(heads))
            report.notes.append(f"bytes estimated from {len(heads)} sampled entries")
        report.counters = backend.counters()
    finally:
        backend.close()
    return report


def _redis_head(backend, key: str) -> tuple[dict, int] | None:
    """``(header, entry size)`` of one Redis entry, reading its prefix and header only."""
    r, name = backend.client, backend._kv(key)  # noqa: SLF001
    prefix = r.getrange(name, 0, PREFIX.size - 1)
    if len(prefix) < PREFIX.size:
        return None
    hlen = PREFIX.unpack(prefix)[2]
    try:
        header, _ = read_header(prefix + r.getrange(name, PREFIX.size, PREFIX.size + hlen - 1))
    except CorruptEntry:
        return None
    return header, int(r.strlen(name))


def format_report(r: StoreReport) -> str:
    """A few lines for a terminal."""
    c = r.counters
    size = "?" if r.bytes is None else f"{r.bytes:,}"
    bpt = "?" if r.bytes_per_token is None else f"{r.bytes_per_token:,.0f}"
    rate = "-" if r.hit_rate is None else f"{100 * r.hit_rate:.1f}%"
    lines = [f"{r.kind} store {r.target}",
             f"  entries          {r.entries:,} ({size} bytes)",
             f"  bytes per token  {bpt} (from {r.sampled} sampled entries; formats "
             f"{', '.join(f'{k} {v}' for k, v in sorted(r.formats.items())) or '-'})",
             f"  hits / misses    {c.get('hits', 0):,} / {c.get('misses', 0):,} (hit rate {rate})",
             f"  recompiles       {c.get('recompiles', 0):,}",
             f"  evictions        {c.get('evictions', c.get('server_evicted_keys', 0)):,}",
             f"  stored           {c.get('puts', 0):,} entries, {c.get('bytes_written', 0):,} bytes written"]
    lines += [f"  model {fp}: {n:,} entries" for fp, n in sorted(r.fingerprints.items())]
    lines += [f"  note: {n}" for n in r.notes]
    return "\n".join(lines)
