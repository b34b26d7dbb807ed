"""A store folder is data, never code (ARCHITECTURE.md §4.4; docs/RESULTS.md §6).

Crafted pickle rows never run, files outside the folder are never read or deleted, a
crafted header never raises into a query, and entries inconsistent with the request
(forged ids, relabelled text, wrong shape, wild base position) are never linked.
"""

from __future__ import annotations

import ast
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cache_helpers import FP, make_chunk
from ragpic.cache import Expected, open_store
from ragpic.cache.tools.check import check_store
from ragpic.cache.format.entry import encode
from ragpic.cache.backends.disk.folder import entry_path
from ragpic.cache.format.keys import chunk_key
from ragpic.core.kv import ChunkKV
from ragpic.errors import StoreError
from store_faults import crafted_legacy_folder, forge, nested_json
from tiny import tiny_tokenizer

CACHE_SRC = Path(__file__).resolve().parents[2] / "ragpic" / "cache"


def test_crafted_pickle_rows_never_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    marker, root = tmp_path / "marker", tmp_path / "index" / "kv"
    victims = [tmp_path / "victim-abs", tmp_path / "victim-rel"]
    for v in victims:
        v.write_text("precious")
    intact = crafted_legacy_folder(root, marker, victims)
    if _diskcache_runs_it(root, tmp_path, marker) is not None:  # the payload is live: diskcache runs it
        assert marker.exists()
        marker.unlink()
    with caplog.at_level(logging.WARNING, logger="ragpic.cache"):
        store = open_store(root, fingerprint=FP, memory_bytes=0)
        got = store.get_many(list(intact))
        texts = store.texts()  # the catalog scan (queries without hints)
    assert set(got) == set(intact) == set(texts) and store.stats().corrupt == 0
    assert "imported 2 entries of a ragpic 0.1 (diskcache) folder without unpickling" in caplog.text
    assert "skipped 4 rows that were not intact ragpic entries" in caplog.text
    store.close()
    assert check_store(str(root)).clean and not (root / "kv").exists() and list((root / "legacy").iterdir())
    assert not marker.exists(), "code from the store folder ran"
    assert all(v.read_text() == "precious" for v in victims)


def _diskcache_runs_it(root: Path, tmp_path: Path, marker: Path) -> bool | None:
    """Sanity: the crafted rows run code when diskcache reads them (a copy, another
    process); ``None`` when diskcache is not installed."""
    import importlib.util

    if importlib.util.find_spec("diskcache") is None:
        return None
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    code = ("import diskcache, sys; c = diskcache.Cache(sys.argv[1]);"
            "[c.get(k) for k in list(c.iterkeys())]")
    subprocess.run([sys.executable, "-c", code, str(copy / "kv")], capture_output=True, timeout=60)
    return marker.exists()


def test_store_code_never_unpickles_nor_imports_diskcache(tmp_path: Path) -> None:
    banned = {"pickle", "cPickle", "dill", "joblib", "diskcache", "shelve", "marshal"}
    for path in CACHE_SRC.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not {n.split(".")[0] for n in names} & banned, f"{path.name} imports {names}"
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("load", "loads") or not isinstance(node.value, ast.Name) \
                    or node.value.id not in ("torch", "np", "numpy", "pickle"), f"{path.name}: {ast.unparse(node)}"
    code = ("import sys; sys.path.insert(0, 'tests'); from cache_helpers import FP, make_chunk;"
            "from ragpic.cache import open_store; from ragpic.cache.tools.check import check_store;"
            f"s = open_store({str(tmp_path)!r}, fingerprint=FP); k, kv, t = make_chunk(1);"
            "s.put_many({k: (kv, t)}); assert s.get_many([k]); s.texts(); check_store(s.backend.path.as_posix());"
            "assert 'diskcache' not in sys.modules, 'diskcache imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=CACHE_SRC.parent.parent, timeout=120)


def test_paths_outside_the_folder_are_never_read_or_deleted(tmp_path: Path) -> None:
    root, outside = tmp_path / "kv", tmp_path / "outside"
    outside.mkdir()
    store = open_store(root, fingerprint=FP, memory_bytes=0, size_limit_bytes=1)  # evict everything
    (k1, kv1, t1), (k2, _, _), (k3, kv3, t3) = make_chunk(1), make_chunk(2), make_chunk(3)
    victim_dir = outside / k1[:2]
    victim_dir.mkdir()
    (victim_dir / f"{k1}.rpkv").write_bytes(b"precious 1")  # behind a symlinked shard folder
    entry_path(root, k1).parent.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(victim_dir, root / "entries" / k1[:2])
    (outside / "v2").write_bytes(b"precious 2")  # an entry file that is a symlink out
    entry_path(root, k2).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(outside / "v2", entry_path(root, k2))
    store.backend._db.query("INSERT INTO entries VALUES ('../../outside/v2', ?, 'x', 10, 0)", (FP,))
    assert store.get_many([k1, k2, "../../outside/v2"]) == {} and store.stats().errors == 0
    assert store.contains_many([k1, k2]) == [False, False]
    for key in (k1, k2, "../../outside/v2"):
        store.backend.delete(key)
    with pytest.raises(StoreError, match=r"could not be stored: UnsafePath: .* outside the store folder"):
        store.put_many({k1: (kv1, t1)}, strict=True)
    store.put_many({k3: (kv3, t3)})  # size limit 1 byte: evicts every entry it may
    store.texts(refresh=True)
    store.close()
    check_store(str(root), repair=True)
    assert (victim_dir / f"{k1}.rpkv").read_bytes() == b"precious 1" and (outside / "v2").read_bytes() == b"precious 2"


def test_nested_json_header_is_corrupt_logged_once_and_recompiled(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    store = open_store(tmp_path, fingerprint=FP, memory_bytes=0)
    key, kv, text = make_chunk(1)
    store.put_many({key: (kv, text)})
    path = entry_path(tmp_path, key)
    path.write_bytes(forge(path.read_bytes(), raw_header=nested_json()))
    with caplog.at_level(logging.WARNING, logger="ragpic.cache"):
        for _ in range(3):  # every query after the first: a plain miss, nothing raised, nothing logged
            assert store.get_many([key]) == {}
    warned = [r for r in caplog.records if key in r.getMessage()]
    assert len(warned) == 1 and "RecursionError" in warned[0].getMessage()
    assert store.stats().corrupt == 1 and not path.exists() and key not in store.texts(refresh=True)
    store.put_many({key: (kv, text)})  # what the engine does on the miss
    store.clear_memory()
    assert list(store.get_many([key])) == [key]


def _chunk(text: str, *, layers: int = 2, heads: int = 2, dtype=torch.float32, base: int = 0) -> ChunkKV:
    ids = torch.tensor(tiny_tokenizer()(text, add_special_tokens=False)["input_ids"])
    g = torch.Generator().manual_seed(len(text))
    shape = (layers, heads, len(ids), 16)
    return ChunkKV(ids, torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype),
                   base, FP, "plain" if base == 0 else f"bos{base}")


EXPECT = Expected(layers=2, kv_heads=2, head_dim=16, dtype="float32",
                  tokenize=lambda t: tiny_tokenizer()(t, add_special_tokens=False)["input_ids"])
TEXT_A = "the quick brown fox jumps over the lazy dog. a needle hides in the haystack"
TEXT_B = "question: what is the best thing to do in san francisco? answer: eat a sandwich"


def _forgeries() -> dict[str, tuple[str, bytes]]:
    """Name -> (key looked up, forged entry bytes) for every inconsistency an honest checksum cannot catch."""
    good = encode(_chunk(TEXT_A), text=TEXT_A)
    key_a, key_b = (chunk_key(FP, t, "plain", "float32") for t in (TEXT_A, TEXT_B))
    ids = _chunk(TEXT_A).token_ids.clone()
    ids[0] ^= 1
    start = len(good) - _chunk(TEXT_A).nbytes - ids.numel() * 8
    payload = good[start:]
    return {
        "token ids re-checksummed": (key_a, forge(good, payload=ids.numpy().tobytes() + payload[ids.numel() * 8:])),
        "text relabelled, filed under its key": (key_b, forge(good, header={"text": TEXT_B})),
        "text relabelled, old key": (key_a, forge(good, header={"text": TEXT_B})),
        "1-layer KV": (key_a, encode(_chunk(TEXT_A, layers=1), text=TEXT_A)),
        "1 KV head": (key_a, encode(_chunk(TEXT_A, heads=1), text=TEXT_A)),
        "fp16 KV under the fp32 key": (key_a, encode(_chunk(TEXT_A, dtype=torch.float16), text=TEXT_A)),
        "base position 10**15": (key_a, forge(good, header={"base_position": 10**15})),
        "base position 1e15 (float)": (key_a, forge(good, header={"base_position": 1e15})),
        "recipe bos4 at base 0": (key_a, forge(good, header={"recipe": "bos4"})),
    }


@pytest.mark.parametrize("case", list(_forgeries()))
def test_entries_inconsistent_with_the_request_are_never_linked(tmp_path: Path, case: str,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    key, data = _forgeries()[case]
    store = open_store(tmp_path, fingerprint=FP, memory_bytes=0)
    path = entry_path(tmp_path, key)  # planted as an attacker would: straight into the folder
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    with caplog.at_level(logging.WARNING, logger="ragpic.cache"):
        assert store.get_many([key], expect=EXPECT) == {}
    assert store.stats().corrupt == 1 and not store.backend.contains(key)
    assert f"KV entry {key} is unusable and was dropped" in caplog.text
    good_key = chunk_key(FP, TEXT_A, "plain", "float32")
    store.put_many({good_key: (_chunk(TEXT_A), TEXT_A)})
    store.clear_memory()
    assert list(store.get_many([good_key], expect=EXPECT)) == [good_key]  # the honest entry still links


def test_orphans_of_dead_writers_are_reclaimed_live_ones_kept(tmp_path: Path) -> None:
    store = open_store(tmp_path, fingerprint=FP)
    key, kv, text = make_chunk(1)
    store.put_many({key: (kv, text)})
    store.close()
    shard = entry_path(tmp_path, key).parent
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    from ragpic.cache.backends.disk.folder import writer_id

    host = writer_id().rsplit("-", 2)[0]
    orphans = [shard / f"{key}.{host}-{dead.stdout.strip()}-aaaa.tmp", shard / f"{key}.otherhost-1-bbbb.tmp"]
    live = shard / f"{key}.{host}-{os.getpid()}-cccc.tmp"
    for f in (*orphans, live):
        f.write_bytes(b"half an entry")
    old = time.time() - 7200
    os.utime(orphans[1], (old, old))
    report = check_store(str(tmp_path))
    assert (report.orphans, report.orphan_bytes, report.entries, report.corrupt) == (2, 26, 1, 0)
    assert check_store(str(tmp_path), repair=True).orphans == 2
    assert not any(f.exists() for f in orphans) and live.exists() and check_store(str(tmp_path)).clean


@pytest.mark.parametrize("how", ["garbage header", "truncated"])
def test_unreadable_legacy_database_is_moved_aside(tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "kv"
    crafted_legacy_folder(root, tmp_path / "marker", [])
    db = root / "kv" / "cache.db"
    data = db.read_bytes()
    db.write_bytes(os.urandom(100) + data[100:] if how == "garbage header" else data[: len(data) // 3])
    with caplog.at_level(logging.WARNING, logger="ragpic.cache"):
        store = open_store(root, fingerprint=FP, memory_bytes=0)
    assert "its cache.db is unreadable" in caplog.text and not (root / "kv").exists()
    assert [p.name.startswith("diskcache-") for p in (root / "damaged").iterdir()] == [True]
    key, kv, text = make_chunk(5)
    store.put_many({key: (kv, text)}, strict=True)  # the folder works: not dropped to memory-only
    store.clear_memory()
    assert list(store.get_many([key])) == [key] and not (tmp_path / "marker").exists()
