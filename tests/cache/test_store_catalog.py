"""One catalog of chunk texts: a text is found in prompts exactly while its entry is stored.

The anchor rows that find texts in a prompt are written with the entry (same transaction)
and leave with it, whether the entry is evicted by its backend, dropped by the store (corrupt,
or ``delete_many``) or lost by a memory-only store's hot tier. A folder store keeps all of
it inside its folder: nothing is written beside it, and the text index an older ragpic kept
beside it is moved in on open.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from cache_helpers import FP, make_chunk
from ragpic.cache import ChunkStore, open_store
from ragpic.cache.backends import DiskBackend, MemoryBackend
from ragpic.cache.format.entry import encode
from redis_server import redis_url  # noqa: F401  (fixture)


def chunks(n: int, tokens: int = 8) -> dict[str, tuple]:
    return {k: (kv, t) for k, kv, t in (make_chunk(s, tokens=tokens) for s in range(n))}


def prompt_of(items: dict[str, tuple]) -> str:
    return "Passages:\n" + "\n".join(t for _, t in items.values()) + "\nQuestion?"


def matched(store: ChunkStore, items: dict[str, tuple]) -> set[str]:
    """The keys of ``items`` whose texts the store's catalog finds in a prompt holding them all."""
    found = set(store.candidates(prompt_of(items)) or ())
    return {k for k, (_, t) in items.items() if t in found}


def stored(store: ChunkStore, items: dict[str, tuple]) -> set[str]:
    return {k for k, hit in zip(items, store.backend.contains_many(list(items))) if hit}


@pytest.mark.parametrize("kind", ["memory", "folder"])
def test_evicted_entries_leave_matching_with_their_rows(kind, tmp_path):
    items = chunks(12, tokens=64)
    size = max(len(encode(kv, text=t)) for kv, t in items.values())
    budget = 4 * size + size // 2  # room for four entries: eight are evicted
    backend = MemoryBackend(budget) if kind == "memory" else DiskBackend(tmp_path / "kv", budget, fingerprint=FP)
    store = ChunkStore(backend, fingerprint=FP, memory_bytes=0)
    for key, item in items.items():
        store.put_many({key: item})
    kept = stored(store, items)
    assert 0 < len(kept) < len(items)
    assert matched(store, items) == kept  # found exactly while stored
    assert set(backend.catalog_texts(FP, list(items))) == kept
    store.close()


def test_a_memory_only_store_matches_what_its_hot_tier_holds():
    items = chunks(6)
    store = ChunkStore(None, fingerprint=FP, memory_bytes=3 * 4300)  # ~3 chunks of 4.2 KiB
    store.put_many(items)
    held = set(store.texts())
    assert 0 < len(held) < len(items) and matched(store, items) == held
    assert set(store.texts_of(list(items))) == held
    store.delete_many([sorted(held)[0]])
    assert matched(store, items) == held - {sorted(held)[0]}
    store.clear_memory()
    assert matched(store, items) == set() and store.texts_of(list(items)) == {}


@pytest.mark.parametrize("kind", ["memory", "folder", pytest.param("redis", marks=pytest.mark.redis)])
def test_dropped_entries_leave_matching(kind, tmp_path, request):
    if kind == "redis":
        import uuid

        from ragpic.cache.backends.redis.backend import RedisBackend

        backend = RedisBackend(request.getfixturevalue("redis_url"), prefix=f"t{uuid.uuid4().hex[:8]}:")
    else:
        backend = MemoryBackend(1 << 30) if kind == "memory" else DiskBackend(tmp_path / "kv", fingerprint=FP)
    store = ChunkStore(backend, fingerprint=FP, memory_bytes=0)
    items = chunks(5)
    store.put_many(items, strict=True)
    assert matched(store, items) == set(items)
    gone = list(items)[:2]
    assert store.delete_many(gone) == gone
    assert matched(store, items) == set(items) - set(gone)
    assert set(store.texts_of(list(items))) == set(items) - set(gone)
    assert set(store.texts(refresh=True)) == set(items) - set(gone)
    # a corrupt entry found on read is dropped the same way (store._drop)
    bad = list(items)[2]
    if kind == "memory":
        backend.put_many({bad: b"RPKV not an entry"})
    elif kind == "redis":
        backend.client.set(backend._kv(bad), b"RPKV not an entry")  # noqa: SLF001
    else:
        (tmp_path / "kv" / "entries" / bad[:2] / f"{bad}.rpkv").write_bytes(b"RPKV not an entry")
    assert bad not in store.get_many([bad]) and store.stats().corrupt == 1
    assert bad not in matched(store, items) and bad not in store.texts_of([bad])
    store.close()


@pytest.mark.redis
def test_a_redis_entry_that_expired_leaves_matching_on_the_next_catalog_read(redis_url):
    import uuid

    from ragpic.cache.backends.redis.backend import RedisBackend

    store = ChunkStore(RedisBackend(redis_url, prefix=f"t{uuid.uuid4().hex[:8]}:"), fingerprint=FP,
                       memory_bytes=0)
    items = chunks(3)
    store.put_many(items, strict=True)
    lost = list(items)[0]
    store.backend.delete(lost)  # what a TTL or maxmemory eviction does behind the store's back
    assert lost not in store.texts(refresh=True)  # the catalog read finds it gone and drops its rows
    assert matched(store, items) == set(items) - {lost}
    store.close()


def _listing(parent: Path) -> set[str]:
    return set(os.listdir(parent))


def test_a_folder_store_writes_nothing_beside_its_folder(tmp_path):
    parent = tmp_path / "index"
    parent.mkdir()
    (parent / "vectors.faiss").write_bytes(b"the vector index lives here")
    before = _listing(parent)
    store = open_store(parent / "kv", fingerprint=FP)
    items = chunks(4)
    store.put_many(items, strict=True)
    assert matched(store, items) == set(items)
    store.delete_many(list(items)[:1])
    store.close()
    again = open_store(parent / "kv", fingerprint=FP)
    assert matched(again, items) == set(items) - set(list(items)[:1])
    again.close()
    assert _listing(parent) == before | {"kv"}


def test_an_engine_on_a_folder_store_writes_nothing_beside_it(tmp_path):
    from ragpic import Config, RagPic
    from tiny import tiny_lm

    before = _listing(tmp_path)
    engine = RagPic(Config(store=str(tmp_path / "kv"), max_new_tokens=2), lm=tiny_lm("llama", num_hidden_layers=2))
    passage = "the quick brown fox jumps over the lazy dog near the park."
    engine.compile([passage])
    result = engine.generate(f"context: {passage} question: what?")
    assert result.chunks_matched == 1 and result.chunks_loaded == 1
    engine.close()
    assert _listing(tmp_path) == before | {"kv"}


def test_a_text_index_beside_the_folder_is_moved_in_on_open(tmp_path):
    root = tmp_path / "kv"
    store = open_store(root, fingerprint=FP)
    items = chunks(3)
    store.put_many(items, strict=True)
    store.close()
    side = tmp_path / "kv.text-index.sqlite"  # what an older ragpic left beside the folder
    with sqlite3.connect(side) as con:
        con.execute("CREATE TABLE postings (fp TEXT, key TEXT, anchor TEXT, length INTEGER, digest TEXT, text TEXT)")
    (tmp_path / "kv.text-index.sqlite-wal").write_bytes(b"")
    again = open_store(root, fingerprint=FP)
    assert _listing(tmp_path) == {"kv"}
    moved = sorted(p.name for p in (root / "legacy").iterdir())
    assert len(moved) == 2 and moved[0].startswith("text-index-") and moved[1].endswith(".sqlite-wal")
    assert matched(again, items) == set(items)
    again.close()


def test_an_index_without_anchor_rows_gets_them_once_on_open(tmp_path):
    """A folder indexed by an older ragpic (entries and counters, no anchors) is matched after
    one writable open; a read-only open of it derives the rows from the catalog instead."""
    root = tmp_path / "kv"
    store = open_store(root, fingerprint=FP)
    items = chunks(4)
    store.put_many(items, strict=True)
    store.close()
    with sqlite3.connect(root / "index.sqlite") as con:  # as the older ragpic left it
        con.executescript("DROP TRIGGER entries_del_anchor; DROP TABLE anchors;")
    reopened = open_store(root, fingerprint=FP)
    assert reopened.backend._db.has_anchors  # noqa: SLF001
    assert matched(reopened, items) == set(items)
    reopened.delete_many(list(items)[:1])
    assert matched(reopened, items) == set(items) - set(list(items)[:1])
    reopened.close()
