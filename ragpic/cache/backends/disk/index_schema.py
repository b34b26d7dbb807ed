"""The tables of a folder store's ``index.sqlite`` (see :mod:`.index_db`), as DDL, with the
older versions an index is upgraded from on open and what ``sqlite_master`` holds in each.

- ``entries(key, fingerprint, text, bytes, access)``: one row per catalogued entry; the
  catalog of a fingerprint is its rows, ``access`` orders LRU eviction.
- ``pending(key, writer, started)``: keys a writer is about to write; a row left by a dead
  writer marks an interrupted write to reconcile on open (see :mod:`ragpic.cache.backends.disk`).
- ``totals``: entry count and bytes, kept by triggers, so stats and the size check are O(1).
- ``counters(name, value)``: what every process using the folder did (hits, misses,
  evictions, recompiles...), added to by each :class:`ChunkStore` (see ``ragpic store stats``).
- ``anchors(key, fingerprint, anchor, length, digest)``: the text-index row of each catalogued
  entry (see :mod:`ragpic.cache.format.anchors`), written in the transaction that writes the
  entry's row and deleted with it by a trigger: evicting, dropping or repairing an entry can
  never leave its text matchable.

An index made before ``counters`` or ``anchors`` existed gets them when opened writable (the
anchors computed once from the rows); opened read-only it is read as it is, without anchors.
"""

from __future__ import annotations

import sqlite3

SCHEMA = (
    "CREATE TABLE entries (key TEXT PRIMARY KEY NOT NULL, fingerprint TEXT NOT NULL, text TEXT NOT NULL,"
    " bytes INTEGER NOT NULL, access REAL NOT NULL) WITHOUT ROWID",
    "CREATE INDEX entries_fingerprint ON entries(fingerprint)",
    "CREATE INDEX entries_access ON entries(access)",
    "CREATE TABLE pending (key TEXT NOT NULL, writer TEXT NOT NULL, started REAL NOT NULL,"
    " PRIMARY KEY (key, writer)) WITHOUT ROWID",
    "CREATE TABLE totals (id INTEGER PRIMARY KEY CHECK (id = 0), entries INTEGER NOT NULL, bytes INTEGER NOT NULL)",
    "INSERT INTO totals VALUES (0, 0, 0)",
    "CREATE TRIGGER entries_ins AFTER INSERT ON entries BEGIN"
    " UPDATE totals SET entries = entries + 1, bytes = bytes + NEW.bytes; END",
    "CREATE TRIGGER entries_del AFTER DELETE ON entries BEGIN"
    " UPDATE totals SET entries = entries - 1, bytes = bytes - OLD.bytes; END",
    "CREATE TRIGGER entries_upd AFTER UPDATE OF bytes ON entries BEGIN"
    " UPDATE totals SET bytes = bytes - OLD.bytes + NEW.bytes; END",
)
# Added after the first release: a folder whose index has only SCHEMA_V1 gets it on open.
COUNTERS = "CREATE TABLE counters (name TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) WITHOUT ROWID"
ANCHORS = (
    "CREATE TABLE anchors (key TEXT PRIMARY KEY NOT NULL, fingerprint TEXT NOT NULL, anchor TEXT NOT NULL,"
    " length INTEGER NOT NULL, digest TEXT NOT NULL) WITHOUT ROWID",
    "CREATE INDEX anchors_lookup ON anchors(fingerprint, anchor)",
    "CREATE INDEX anchors_length ON anchors(fingerprint, length)",
    "CREATE TRIGGER entries_del_anchor AFTER DELETE ON entries BEGIN DELETE FROM anchors WHERE key = OLD.key; END",
)
SCHEMA_V1 = SCHEMA
SCHEMA_V2 = SCHEMA_V1 + (COUNTERS,)
SCHEMA = SCHEMA_V2 + ANCHORS


def _reference_master(schema: tuple[str, ...]) -> set[tuple]:
    con = sqlite3.connect(":memory:")
    for stmt in schema:
        con.execute(stmt)
    rows = set(con.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))
    con.close()
    return rows


#: what ``sqlite_master`` holds in an index of each version (compared on open)
MASTER, MASTER_V2, MASTER_V1 = (_reference_master(s) for s in (SCHEMA, SCHEMA_V2, SCHEMA_V1))
