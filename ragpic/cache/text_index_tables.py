"""Where a :class:`~ragpic.cache.text_index.TextIndex` keeps its rows: memory, SQLite or Redis.

Every table answers the same calls: ``add([(anchor, Posting, text)])``, ``remove(keys)``,
``lookup(anchors) -> {anchor: [Posting]}`` (one batched round trip), ``texts(keys)`` and
``short_lengths()`` (distinct lengths of chunks shorter than the anchor). Rows are per model
fingerprint: one store may hold several models' entries.

Redis layout, for prefix ``p`` and fingerprint ``fp`` (beside the store's own keys)::

    p + "tidx:" + fp + ":a"   hash  anchor -> "key|len|digest;key|len|digest..."
    p + "tidx:" + fp + ":t"   hash  key -> text            (texts by id, for the cache API)
    p + "tidx:" + fp + ":k"   hash  key -> anchor          (for removal)
    p + "tidx:" + fp + ":s"   set   lengths of short chunks
    p + "tidx:" + fp + ":filled"  marker: the index was filled from the catalog once

Postings of one anchor are appended by a Lua script, so two workers indexing chunks with the
same first characters at once cannot lose one another's row.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from ragpic.cache.text_index import ANCHOR, Posting

__all__ = ["MemoryTable", "RedisTable", "SqliteTable"]

Row = tuple[str, Posting, str]


class MemoryTable:
    """A process-local table (memory-only stores)."""

    def __init__(self) -> None:
        self._by_anchor: dict[str, dict[str, Posting]] = {}
        self._keys: dict[str, tuple[str, str]] = {}  # key -> (anchor, text)
        self._lock = threading.Lock()
        self.filled = False
        self._has_short = False  # short chunks are rare: skip the scan until one is added

    def add(self, rows: Sequence[Row]) -> None:
        with self._lock:
            for anchor, post, text in rows:
                self._by_anchor.setdefault(anchor, {})[post.key] = post
                self._keys[post.key] = (anchor, text)
                self._has_short = self._has_short or post.length < ANCHOR

    def mark_filled(self) -> None:
        self.filled = True

    def count(self) -> int:
        with self._lock:
            return len(self._keys)

    def remove(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                anchor, _ = self._keys.pop(key, (None, None))
                if anchor is not None:
                    self._by_anchor.get(anchor, {}).pop(key, None)

    def lookup(self, anchors: Sequence[str]) -> dict[str, list[Posting]]:
        with self._lock:
            return {a: list(self._by_anchor[a].values()) for a in anchors if self._by_anchor.get(a)}

    def texts(self, keys: Sequence[str]) -> dict[str, str]:
        with self._lock:
            return {k: self._keys[k][1] for k in keys if k in self._keys}

    def short_lengths(self) -> set[int]:
        with self._lock:
            return {len(t) for _, t in self._keys.values() if len(t) < ANCHOR} if self._has_short else set()


_SCHEMA = """
CREATE TABLE IF NOT EXISTS postings (fp TEXT NOT NULL, key TEXT NOT NULL, anchor TEXT NOT NULL,
    length INTEGER NOT NULL, digest TEXT NOT NULL, text TEXT NOT NULL, PRIMARY KEY (fp, key));
CREATE INDEX IF NOT EXISTS postings_anchor ON postings (fp, anchor);
CREATE TABLE IF NOT EXISTS shorts (fp TEXT NOT NULL, length INTEGER NOT NULL, PRIMARY KEY (fp, length));
CREATE TABLE IF NOT EXISTS filled (fp TEXT PRIMARY KEY);
"""
# Rows per fingerprint, kept by triggers so that count() is O(1); added to older files by
# _add_counts, table, rows and triggers in one transaction (a concurrent insert cannot slip
# between the COUNT(*) and the triggers).
_COUNTS = (
    "CREATE TABLE IF NOT EXISTS counts (fp TEXT PRIMARY KEY, n INTEGER NOT NULL)",
    "INSERT OR REPLACE INTO counts SELECT fp, COUNT(*) FROM postings GROUP BY fp",
    "CREATE TRIGGER postings_ins AFTER INSERT ON postings BEGIN"
    " INSERT INTO counts VALUES (NEW.fp, 1) ON CONFLICT (fp) DO UPDATE SET n = n + 1; END",
    "CREATE TRIGGER postings_del AFTER DELETE ON postings BEGIN UPDATE counts SET n = n - 1 WHERE fp = OLD.fp; END",
)


class SqliteTable:
    """A SQLite file shared by the processes using one folder store (WAL: readers never block)."""

    def __init__(self, path: str | Path, fingerprint: str, busy_s: float = 2.0):
        self.path, self.fp = Path(path), fingerprint
        self._db = sqlite3.connect(self.path, timeout=busy_s, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            # Index pages read through the OS page cache, shared by every worker on the machine,
            # not copied into each connection's 2 MB cache: matching at 100k chunks measured
            # 1.1-1.5x that at 1k with it, 1.5-2.3x without (tests/test_text_index.py -s).
            self._db.execute("PRAGMA mmap_size=268435456")
            self._db.executescript(_SCHEMA)
            self._add_counts()

    def _add_counts(self) -> None:
        """Give a file without the ``counts`` table (new, or written by an older ragpic) its
        table, one O(index) count, and the triggers, atomically; a no-op from then on."""
        has = "SELECT 1 FROM sqlite_master WHERE type='trigger' AND name='postings_ins'"
        if self._db.execute(has).fetchone() is not None:
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if self._db.execute(has).fetchone() is None:  # another process may have just added them
                for stmt in _COUNTS:
                    self._db.execute(stmt)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    @property
    def filled(self) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM filled WHERE fp=?", (self.fp,)).fetchone() is not None

    def mark_filled(self) -> None:
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO filled VALUES (?)", (self.fp,))

    def count(self) -> int:
        """Chunks indexed for this fingerprint (compared with the store's on open)."""
        with self._lock:
            row = self._db.execute("SELECT n FROM counts WHERE fp=?", (self.fp,)).fetchone()
            return int(row[0]) if row else 0

    def add(self, rows: Sequence[Row]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                # an upsert, not INSERT OR REPLACE: REPLACE's implicit delete fires no trigger
                self._db.executemany("INSERT INTO postings VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (fp, key) DO UPDATE"
                                     " SET anchor=excluded.anchor, length=excluded.length,"
                                     " digest=excluded.digest, text=excluded.text",
                                     [(self.fp, p.key, a, p.length, p.digest, t) for a, p, t in rows])
                self._db.executemany("INSERT OR IGNORE INTO shorts VALUES (?, ?)",
                                     [(self.fp, p.length) for _, p, _ in rows if p.length < ANCHOR])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def remove(self, keys: Sequence[str]) -> None:
        with self._lock:
            self._db.executemany("DELETE FROM postings WHERE fp=? AND key=?", [(self.fp, k) for k in keys])

    def _select(self, sql: str, values: Sequence[str]) -> list[tuple]:
        out: list[tuple] = []
        with self._lock:
            for lo in range(0, len(values), 900):  # SQLite's bound-parameter limit
                part = values[lo:lo + 900]
                out += self._db.execute(sql.format(",".join("?" * len(part))), (self.fp, *part)).fetchall()
        return out

    def lookup(self, anchors: Sequence[str]) -> dict[str, list[Posting]]:
        out: dict[str, list[Posting]] = {}
        for a, k, n, d in self._select("SELECT anchor, key, length, digest FROM postings WHERE fp=? AND anchor IN ({})",
                                       list(anchors)):
            out.setdefault(a, []).append(Posting(k, n, d))
        return out

    def texts(self, keys: Sequence[str]) -> dict[str, str]:
        return dict(self._select("SELECT key, text FROM postings WHERE fp=? AND key IN ({})", list(keys)))

    def short_lengths(self) -> set[int]:
        with self._lock:
            return {n for (n,) in self._db.execute("SELECT length FROM shorts WHERE fp=?", (self.fp,))}

    def close(self) -> None:
        with self._lock:
            self._db.close()


_APPEND = """
for i = 1, #ARGV, 2 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  if not cur then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  elseif not string.find(';' .. cur .. ';', ';' .. ARGV[i + 1] .. ';', 1, true) then
    redis.call('HSET', KEYS[1], ARGV[i], cur .. ';' .. ARGV[i + 1])
  end
end
"""
_DROP = """
for i = 1, #ARGV, 2 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  if cur then
    local kept = {}
    for p in string.gmatch(cur, '[^;]+') do
      if string.sub(p, 1, #ARGV[i + 1] + 1) ~= ARGV[i + 1] .. '|' then table.insert(kept, p) end
    end
    if #kept == 0 then redis.call('HDEL', KEYS[1], ARGV[i]) else redis.call('HSET', KEYS[1], ARGV[i], table.concat(kept, ';')) end
  end
end
"""


class RedisTable:
    """Rows in the Redis server of a shared store (every worker sees every other's chunks)."""

    def __init__(self, client, prefix: str, fingerprint: str):
        self._r = client
        base = f"{prefix}tidx:{fingerprint}:"
        self._a, self._t, self._k, self._s, self._f = (base + s for s in ("a", "t", "k", "s", "filled"))
        self._append = client.register_script(_APPEND)
        self._drop = client.register_script(_DROP)
        # A cluster pipeline refuses scripts (EVALSHA): there the append runs after the pipeline,
        # on the one node that holds the postings hash.
        self._scripts_in_pipeline = not hasattr(client, "get_nodes")

    @property
    def filled(self) -> bool:
        return bool(self._r.exists(self._f))

    def mark_filled(self) -> None:
        self._r.set(self._f, "1")

    def count(self) -> int:
        return int(self._r.hlen(self._t))

    def add(self, rows: Sequence[Row]) -> None:
        for lo in range(0, len(rows), 1024):
            part = rows[lo:lo + 1024]
            pipe = self._r.pipeline(transaction=False)
            pipe.hset(self._t, mapping={p.key: t for _, p, t in part})
            pipe.hset(self._k, mapping={p.key: a for a, p, _ in part})
            shorts = {p.length for _, p, _ in part if p.length < ANCHOR}
            if shorts:
                pipe.sadd(self._s, *shorts)
            args = [x for a, p, _ in part for x in (a, p.encode())]
            if self._scripts_in_pipeline:
                self._append(keys=[self._a], args=args, client=pipe)
            pipe.execute()
            if not self._scripts_in_pipeline:
                self._append(keys=[self._a], args=args)

    def remove(self, keys: Sequence[str]) -> None:
        anchors = self._r.hmget(self._k, list(keys)) if keys else []
        pairs = [x for k, a in zip(keys, anchors) if a is not None for x in (a.decode(), k)]
        if pairs:
            self._drop(keys=[self._a], args=pairs)
        if keys:
            self._r.hdel(self._t, *keys)
            self._r.hdel(self._k, *keys)

    def lookup(self, anchors: Sequence[str]) -> dict[str, list[Posting]]:
        if not anchors:
            return {}
        raw = self._r.hmget(self._a, list(anchors))
        return {a: [Posting.decode(p) for p in v.decode().split(";")] for a, v in zip(anchors, raw) if v}

    def texts(self, keys: Sequence[str]) -> dict[str, str]:
        if not keys:
            return {}
        return {k: v.decode("utf-8") for k, v in zip(keys, self._r.hmget(self._t, list(keys))) if v is not None}

    def short_lengths(self) -> set[int]:
        return {int(n) for n in self._r.smembers(self._s)}
