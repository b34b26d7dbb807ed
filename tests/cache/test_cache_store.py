"""ChunkStore over memory and folder backends: tiers, catalog, damage on disk, size limits, failures."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from cache_helpers import FP, make_chunk, same_kv
from ragpic.cache import ChunkStore, open_store
from ragpic.cache.backends import DiskBackend, KVBackend, MemoryBackend
from ragpic.cache.format.anchors import posting_of
from ragpic.cache.format.entry import encode
from ragpic.cache.backends.disk.folder import entry_path


def _fill(store: ChunkStore, seeds, **kw) -> dict[str, tuple]:
    items = {}
    for s in seeds:
        key, kv, text = make_chunk(s, **kw)
        items[key] = (kv, text)
    store.put_many(items)
    return items


class _Recording:
    """A backend seen through the names of the calls made on it."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, set()

    def __getattr__(self, name: str):
        self.calls.add(name)
        return getattr(self.inner, name)


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_backends_satisfy_protocol(tmp_path: Path, kind: str) -> None:
    """Every call the protocol declares does what its docstring says, on each backend."""
    inner = MemoryBackend(1 << 20) if kind == "memory" else DiskBackend(tmp_path / "kv", fingerprint=FP)
    backend = _Recording(inner)
    (ka, kva, ta), (kb, kvb, tb) = make_chunk(1), make_chunk(2)
    a, b, absent = encode(kva, text=ta), encode(kvb, text=tb), "0" * 64
    backend.put_many({ka: a, kb: b})
    assert backend.get_many([kb, absent, ka]) == [b, None, a]  # in the order asked, None where absent
    assert backend.contains(ka) and not backend.contains(absent)
    backend.catalog_add(FP, {ka: ta, kb: tb})
    assert backend.catalog(FP) == {ka: ta, kb: tb} and backend.catalog("other-model") == {}
    assert backend.catalog_has(FP, [kb, absent, ka]) == [True, False, True]
    backend.delete(ka)
    backend.delete(ka)  # absent now: no error
    assert backend.get_many([ka, kb]) == [None, b] and not backend.contains(ka)
    assert backend.catalog(FP) == {kb: tb}  # only entries still stored
    assert backend.stats()["entries"] == 1
    assert backend.contains_many([kb, absent, ka]) == [True, False, False]
    assert backend.catalog_texts(FP, [kb, absent, ka]) == {kb: tb}
    anchor_b, post_b = posting_of(kb, tb)
    assert backend.anchor_lookup(FP, [anchor_b, "0" * 16, posting_of(ka, ta)[0]]) == {anchor_b: [post_b]}
    assert backend.short_lengths(FP) == {len(tb)}  # the test texts are shorter than an anchor
    assert backend.is_unreachable(TimeoutError()) and not backend.is_unreachable(KeyError("x"))
    backend.add_counters({"hits": 2})
    backend.add_counters({"hits": 3})
    assert backend.counters().get("hits", 0) == (5 if kind == "disk" else 0)  # memory keeps no shared counts
    backend.drop(FP, [kb])  # entry and catalog row together
    assert backend.get_many([kb]) == [None] and backend.catalog(FP) == {} and backend.anchor_lookup(FP, [anchor_b]) == {}
    backend.put_many({ka: a})
    backend.catalog_add(FP, {ka: ta})
    backend.catalog_remove(FP, [ka])
    assert backend.catalog(FP) == {} and backend.contains(ka)  # the row goes, the entry stays
    backend.close()
    declared = {n for n, v in vars(KVBackend).items() if callable(v) and not n.startswith("_")}
    assert declared and declared <= backend.calls, declared - backend.calls  # none left untested


def test_backends_are_kvbackends_and_a_partial_one_is_refused(tmp_path: Path) -> None:
    from ragpic.cache.backends import RedisBackend

    disk = DiskBackend(tmp_path / "kv", fingerprint=FP)
    assert isinstance(MemoryBackend(1 << 20), KVBackend) and isinstance(disk, KVBackend)
    assert issubclass(RedisBackend, KVBackend)
    disk.close()

    class NoCatalog(KVBackend):  # a medium that forgot the catalog calls
        get_many = put_many = contains = delete = stats = close = lambda self, *a, **k: None

    with pytest.raises(TypeError, match="catalog"):
        NoCatalog()


def test_memory_backend_budget_and_lru_order() -> None:
    mem = MemoryBackend(max_bytes=1000)
    mem.put_many({"a": b"x" * 400, "b": b"y" * 400})
    assert mem.get_many(["a"]) == [b"x" * 400]  # a is now most recent
    mem.put_many({"c": b"z" * 400})
    assert mem.stats()["bytes"] <= 1000 and mem.get_many(["a", "b", "c"])[1] is None
    mem.put_many({"huge": b"h" * 2000})
    assert not mem.contains("huge") and mem.stats()["bytes"] <= 1000


def test_memory_store_hits_and_budget() -> None:
    store = open_store("memory", fingerprint=FP, memory_bytes=3 * 4300)  # ~3 chunks of 4.2 KiB
    items = _fill(store, range(5))
    got = store.get_many(list(items))
    assert 2 <= len(got) <= 3 and all(same_kv(kv, items[k][0]) for k, kv in got.items())
    st = store.stats()
    assert st.memory_hits == len(got) and st.misses == 5 - len(got) and st.puts == 5
    assert set(store.texts()) == set(got)
    store.reset_stats()
    assert store.stats().memory_hits == 0


def test_disk_store_survives_restart_with_catalog(tmp_path: Path) -> None:
    path = tmp_path / "index" / "kv"
    store = open_store(path, fingerprint=FP, recipes=["plain"])
    items = _fill(store, range(6), tokens=300)  # > 32 KiB: stored as files
    store.close()
    store = open_store(path, fingerprint=FP, memory_bytes=0)
    assert store.texts() == {k: t for k, (_, t) in items.items()}
    assert store.contains_many(list(items) + ["nope"]) == [True] * 6 + [False]
    got = store.get_many(list(items))
    assert all(same_kv(got[k], kv) for k, (kv, _) in items.items())
    st = store.stats()
    assert st.backend_hits == 6 and st.bytes_read > 6 * 300 * 2 * 2 * 16 * 4 * 2 and st.corrupt == 0
    man = store.backend.manifest()
    assert man["fingerprint"] == FP and man["recipes"] == ["plain"] and man["format_version"] == 1
    store.close()
    other = open_store(path, fingerprint="other-model")  # allowed: keys are content-addressed
    assert other.backend.manifest()["fingerprint"] == FP and other.texts() == {}
    assert other.get_many(list(items)) == {}
    other.close()


def _both_tiers(path: Path, quant: str):
    """One chunk stored with ``quant`` in a folder store: ``(kv written, kv from the hot tier,
    kv from the folder)``."""
    store = open_store(path, fingerprint=FP, quant=quant)
    items = _fill(store, [1], tokens=64, head_dim=64)
    ((key, (kv, _)),) = items.items()
    hot = store.get_many([key])[key]
    store.clear_memory()
    cold = store.get_many([key])[key]
    store.close()
    return kv, hot, cold


def test_int8_store_round_trip(tmp_path: Path) -> None:
    kv, hot, cold = _both_tiers(tmp_path / "kv", "int8")
    assert cold.is_quantized and cold.nbytes < kv.nbytes / 3  # int8 in memory, scales beside
    hot_keys, cold_keys = (x.to("cpu", kv.dtype).keys for x in (hot, cold))
    assert torch.equal(hot_keys, cold_keys)  # same answer from either tier
    assert float((cold_keys - kv.keys).abs().max()) <= float(kv.keys.abs().max()) / 127


def test_encode_many_stores_nothing_and_write_stores_what_it_encoded(tmp_path: Path) -> None:
    """put_many's two halves (the server encodes on its model thread, writes elsewhere):
    encode_many leaves the store as it was; write stores exactly the entries it was given,
    which read back as its ``read_form`` from both tiers."""
    store = open_store(tmp_path / "kv", fingerprint=FP, quant="int8")
    key, kv, text = make_chunk(3, tokens=64, head_dim=64)
    encoded = store.encode_many({key: (kv, text)}, strict=True)
    assert store.get_many([key]) == {} and store.texts() == {}
    assert list(encoded.entries) == [key] and encoded.read_form[key].is_quantized
    assert store.write(encoded, strict=True) == [key] and store.texts() == {key: text}
    hot = store.get_many([key])[key]
    store.clear_memory()
    cold = store.get_many([key])[key]
    for got in (hot, cold):
        assert torch.equal(got.keys, encoded.read_form[key].keys) and torch.equal(got.key_scales, encoded.read_form[key].key_scales)
    store.close()


def test_int4_store_round_trip_and_an_engine_on_it(tmp_path: Path) -> None:
    """The hot tier and the folder hand back the same (dequantized) KV; an engine with
    ``kv_quant="int4"`` links it and answers like linking that KV from memory."""
    kv, hot, cold = _both_tiers(tmp_path / "kv", "int4")
    assert not cold.is_quantized and torch.equal(hot.keys, cold.keys)
    assert 0 < float((cold.keys - kv.keys).abs().max()) < float(kv.keys.abs().max()) / 7

    from prompts import CHUNKS
    from ragpic import Config, RagPic
    from ragpic.eval.variants import store_round_trip
    from tiny import tiny_lm

    lm = tiny_lm("llama", num_hidden_layers=2)
    engine = RagPic(Config(store=str(tmp_path / "kv4"), kv_quant="int4", device="cpu"), lm=lm)
    assert engine.compile(CHUNKS[:2]) == 2
    engine.store.clear_memory()
    prompt = CHUNKS[0] + "\n\n" + CHUNKS[1] + " what did the fox do?"
    g = engine.generate(prompt, chat=False, max_new_tokens=4)
    assert (g.chunks_loaded, g.chunks_compiled) == (2, 0)
    stored = [engine.store.get_many([engine.chunk_key(t)])[engine.chunk_key(t)] for t in CHUNKS[:2]]
    ref = RagPic(Config(store=None, device="cpu", kv_quant="none"), lm=lm)  # exact KV, in memory
    ref.compile(CHUNKS[:2])
    floats = [ref.store.get_many([ref.chunk_key(t)])[ref.chunk_key(t)] for t in CHUNKS[:2]]
    assert all(torch.equal(a.keys, store_round_trip(b, "int4").keys) for a, b in zip(stored, floats))
    engine.store.close()


def _value_file(path: Path, key: str) -> Path:
    return entry_path(path, key)


def _damage(path: Path, key: str, how: str) -> None:
    if how == "truncate":
        f = _value_file(path, key)
        f.write_bytes(f.read_bytes()[:-1000])
    elif how in ("flip_file", "flip_small"):
        f = _value_file(path, key)
        data = bytearray(f.read_bytes())
        data[len(data) // 2 if how == "flip_file" else -3] ^= 0x80
        f.write_bytes(bytes(data))
    elif how in ("foreign", "misfiled"):
        seed_fp = "other-model" if how == "foreign" else FP
        _, kv, text = make_chunk(99, tokens=300, fingerprint=seed_fp)
        backend = DiskBackend(path)
        backend.put_many({key: encode(kv, text=text)})
        backend.close()


@pytest.mark.parametrize("how", ["truncate", "flip_file", "flip_small", "foreign", "misfiled"])
def test_damaged_disk_entry_is_dropped(tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str) -> None:
    tokens = 4 if how == "flip_small" else 300
    store = open_store(tmp_path, fingerprint=FP, memory_bytes=0)
    items = _fill(store, [1, 2], tokens=tokens)
    bad, good = list(items)
    store.close()
    _damage(tmp_path, bad, how)
    store = open_store(tmp_path, fingerprint=FP, memory_bytes=0)
    with caplog.at_level(logging.WARNING, logger="ragpic.cache"):
        got = store.get_many([bad, good])
    assert list(got) == [good] and same_kv(got[good], items[good][0])
    assert any(bad in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    st = store.stats()
    assert st.corrupt == 1 and st.misses == 1 and st.backend_hits == 1
    assert not store.backend.contains(bad) and bad not in store.texts(refresh=True)
    assert store.get_many([bad]) == {}  # now a plain miss: the engine recompiles it
    store.close()


def test_disk_size_limit_evicts_least_recently_used(tmp_path: Path) -> None:
    limit = 1 << 20  # least recently used entries are evicted as soon as the bytes pass it
    store = open_store(tmp_path, fingerprint=FP, memory_bytes=0, size_limit_bytes=limit)
    keys: list[str] = []
    for s in range(60):
        keys += list(_fill(store, [s], tokens=64))  # ~33 KiB per entry, stored as a file
        store.get_many(keys[:1])  # keep the first entry recently used
        assert store.backend.stats()["volume_bytes"] <= limit
    assert store.backend.stats()["entries"] < 35
    store.reset_stats()
    got = store.get_many(keys)
    assert keys[0] in got and keys[1] not in got  # LRU kept the hot one, evicted old ones
    assert store.stats().misses == 60 - len(got) > 20
    assert set(store.texts(refresh=True)) == set(got)  # evicted rows pruned from the catalog
    store.close()


def test_disk_budget_under_zipf_requests_evicts_exactly_like_lru(tmp_path: Path) -> None:
    """A miss is a recompile put back; the folder's byte budget must then behave as an LRU of
    ``budget // entry size`` entries on the same request sequence (benchmarks/sim_eviction.py
    runs this at corpus scale)."""
    import random
    from collections import OrderedDict

    chunks = {s: make_chunk(s, tokens=16) for s in range(100, 140)}  # 3-digit seeds: equal sizes
    size = len(encode(chunks[100][1], text=chunks[100][2]))
    capacity = 7
    store = open_store(tmp_path, fingerprint=FP, memory_bytes=0, size_limit_bytes=capacity * size)
    rng = random.Random(0)
    weights = [1 / (i + 1) for i in range(len(chunks))]
    requests = rng.choices(sorted(chunks), weights=weights, k=300)
    lru: OrderedDict[int, None] = OrderedDict()
    want = recompiles = 0
    for r in requests:
        key, kv, text = chunks[r]
        want += r in lru
        lru[r] = None
        lru.move_to_end(r)
        if len(lru) > capacity:
            lru.popitem(last=False)
        if not store.get_many([key]):
            recompiles += 1
            store.put_many({key: (kv, text)})
        assert store.backend.stats()["volume_bytes"] <= capacity * size
    assert store.stats().hits == want and 0 < want < len(requests)
    assert store.backend.evictions == recompiles - capacity
    assert set(store.texts(refresh=True)) == {chunks[r][0] for r in lru}  # the same survivors
    store.close()


def test_unusable_folder_degrades_to_memory(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="ragpic.cache"):
        store = open_store(blocker / "kv", fingerprint=FP)
    assert store.backend is None and store.stats().errors == 1
    assert "unusable" in caplog.text
    items = _fill(store, [1])
    assert set(store.get_many(list(items))) == set(items)


def test_a_chunk_compiled_on_a_miss_is_linked_as_the_store_will_return_it(tmp_path: Path) -> None:
    """With the default int8 store, the query that compiles a missing chunk links the same
    (int8) KV that every later query loads, so its answer is not a one-off."""
    from prompts import CHUNKS
    from ragpic import Config, RagPic
    from tiny import tiny_lm

    engine = RagPic(Config(store=str(tmp_path / "kv"), device="cpu"), lm=tiny_lm("llama"))
    assert engine.config.kv_quant == "int8"
    prompt = engine.format_prompt(CHUNKS[0] + "\n\n" + CHUNKS[1] + " what did the fox do?")
    miss, stats = engine.segments(prompt, hints=CHUNKS[:2])
    assert stats.compiled == 2
    engine.store.clear_memory()
    hit, stats = engine.segments(prompt, hints=CHUNKS[:2])
    assert (stats.loaded, stats.compiled) == (2, 0)
    chunks = [(a.kv, b.kv) for a, b in zip(miss, hit) if a.is_chunk]
    assert len(chunks) == 2 and all(a.is_quantized and b.is_quantized for a, b in chunks)
    assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values) for a, b in chunks)
    engine.close()


def test_stored_form_is_the_entry_put_many_stored_and_an_unstorable_kv_itself() -> None:
    store = ChunkStore(MemoryBackend(1 << 20), fingerprint=FP, quant="int8")
    key, kv, text = make_chunk(5)
    store.put_many({key: (kv, text)})
    stored = store.stored_form(key, kv)
    assert stored.is_quantized and same_kv(stored, store.get_many([key])[key])
    store.clear_memory()  # the hot tier let it go: the round trip gives the same entry
    assert same_kv(store.stored_form(key, kv), stored)
    bad_key, bad, bad_text = make_chunk(6)
    bad.keys[0, 0, 0, 0] = float("nan")  # int8 cannot encode it: not stored, the query keeps it
    assert store.put_many({bad_key: (bad, bad_text)}) == [] and store.stats().errors == 1
    assert store.stored_form(bad_key, bad) is bad
    assert ChunkStore(None, fingerprint=FP).stored_form(key, kv) is kv  # exact storage
