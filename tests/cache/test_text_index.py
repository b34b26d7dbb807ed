"""The catalog's text index: prompts matched at a cost set by the prompt, not by the store.

The anchor rows live in each backend's catalog (memory, the folder's ``index.sqlite``, Redis):
same answers as the old catalog scan (``find_chunks`` over every stored text), shared between
two backends on one Redis (workers), and the per-prompt time at 100k catalogued chunks within
2x of that at 1k. What keeps the rows in step with the entries is in test_store_catalog.py.
"""

from __future__ import annotations

import random
import statistics
import time

import pytest

from cache_helpers import FP
from ragpic.cache.backends import DiskBackend, KVBackend, MemoryBackend
from ragpic.cache.format.anchors import ANCHOR
from ragpic.cache.store import ChunkStore
from ragpic.cache.store.text_match import TextMatcher
from ragpic.core.segments import find_chunks
from redis_server import redis_url  # noqa: F401  (fixture)

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()


def corpus(n: int, seed: int = 0) -> dict[str, str]:
    rng = random.Random(seed)
    return {f"key{i}": f"doc {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30))) + "."
            for i in range(n)}


def prompt_of(texts: list[str]) -> str:
    return "Answer from the passages.\n\n" + "\n\n".join(texts) + "\n\nQuestion: which doc says alpha?"


def catalogue(backend: KVBackend, texts: dict[str, str], fingerprint: str = FP) -> None:
    """Catalog rows for ``texts`` as a store writes them with its entries (the entries' bytes
    do not matter to matching: a folder's rows are written straight into its index)."""
    if isinstance(backend, DiskBackend):
        with backend._db.transaction() as con:  # noqa: SLF001
            backend._db.upsert(con, [(k, fingerprint, t, 1, 0.0) for k, t in texts.items()])  # noqa: SLF001
    else:
        if isinstance(backend, MemoryBackend):
            backend.put_many({k: b"x" for k in texts})  # a memory catalog rows only stored keys
        backend.catalog_add(fingerprint, texts)


def backend_of(kind: str, tmp_path, name: str = "kv") -> KVBackend:
    return MemoryBackend(1 << 30) if kind == "memory" else DiskBackend(tmp_path / name, fingerprint=FP)


def matcher(backend: KVBackend, fingerprint: str = FP) -> TextMatcher:
    return TextMatcher(lambda a: backend.anchor_lookup(fingerprint, a), lambda: backend.short_lengths(fingerprint))


@pytest.mark.parametrize("kind", ["memory", "folder"])
def test_same_matches_as_a_catalog_scan(kind, tmp_path):
    backend = backend_of(kind, tmp_path)
    texts = corpus(500)
    texts["short"] = "kappa mu nu"  # shorter than the anchor: indexed by its whole text
    texts["inside"] = "doc 7"  # occurs inside longer chunks and words: the usual rules decide
    catalogue(backend, texts)
    index = matcher(backend)
    rng = random.Random(1)
    for _ in range(20):
        chosen = [texts[k] for k in rng.sample(sorted(texts), 6)] + [texts["short"]]
        prompt = prompt_of(chosen) + " banana" + texts["short"][:-1]  # a cut copy must not match
        want = find_chunks(prompt, texts.values())
        assert find_chunks(prompt, index.candidates(prompt)) == want
        assert {m.text for m in want} >= set(chosen)


@pytest.mark.parametrize("kind", ["memory", "folder"])
def test_a_document_cut_inside_words_is_found_piece_by_piece(kind, tmp_path):
    """A document cut at any character and linked whole: each piece after the first starts
    inside a word, where the piece before it ends (one more probe round per such start)."""
    backend = backend_of(kind, tmp_path)
    words = [f"{WORDS[i % len(WORDS)]}{i * 7919}" for i in range(60)]  # long words, digits inside
    doc = " ".join(words)
    starts = [doc.index(w) for w in words]
    cuts = [0, *(starts[i] + 3 for i in range(4, 60, 6)), len(doc)]  # every cut three characters into a word
    pieces = [doc[a:b] for a, b in zip(cuts, cuts[1:])]
    catalogue(backend, {**{f"p{i}": t for i, t in enumerate(pieces)}, **corpus(30)})
    prompt = "Read the record.\n\n" + doc + "\n\nWhat comes after alpha0?"
    found = matcher(backend).candidates(prompt)
    assert sorted(found) == sorted(pieces)
    assert [m.text for m in find_chunks(prompt, found)] == pieces
    # without piece 3 the probes stop where it would start, and the pieces before it end inside
    # a word nothing stored fills: none of them is linked (a stored "an" never matches in "banana")
    backend.catalog_remove(FP, ["p3"])
    found = matcher(backend).candidates(prompt)
    assert sorted(found) == sorted(pieces[:3])
    assert find_chunks(prompt, found) == []


@pytest.mark.parametrize("kind", ["memory", "folder"])
def test_removed_chunks_stop_matching_and_texts_by_key(kind, tmp_path):
    backend = backend_of(kind, tmp_path)
    texts = corpus(50)
    catalogue(backend, texts)
    prompt = prompt_of([texts["key3"], texts["key4"]])
    backend.catalog_remove(FP, ["key3"])
    assert matcher(backend).candidates(prompt) == [texts["key4"]]
    assert backend.catalog_texts(FP, ["key4", "key3", "nope"]) == {"key4": texts["key4"]}
    assert matcher(backend, "other-model").candidates(prompt) == []  # rows are per fingerprint


@pytest.mark.redis
def test_redis_rows_are_shared_between_workers(redis_url):
    import uuid

    from ragpic.cache.backends.redis.backend import RedisBackend

    prefix = f"t{uuid.uuid4().hex[:8]}:"
    a, b = RedisBackend(redis_url, prefix=prefix), RedisBackend(redis_url, prefix=prefix)
    texts = corpus(300)
    same_start = {"twin1": texts["key1"] + " one", "twin2": texts["key1"] + " two"}  # one anchor, two chunks
    a.catalog_add(FP, texts)
    b.catalog_add(FP, same_start)  # another worker, same anchor: both rows kept
    prompt = prompt_of([texts["key2"], same_start["twin2"], "short one"])
    b.catalog_add(FP, {"short": "short one"})
    assert sorted(matcher(a).candidates(prompt)) == sorted([texts["key2"], same_start["twin2"], texts["key1"],
                                                           "short one"])
    a.catalog_remove(FP, ["twin2"])
    assert same_start["twin2"] not in matcher(b).candidates(prompt)
    assert b.catalog_texts(FP, ["key2"]) == {"key2": texts["key2"]}
    a.close()
    b.close()


def test_a_failing_backend_says_so_and_is_not_asked_again_at_once():
    class Down(MemoryBackend):
        calls = 0

        def anchor_lookup(self, fingerprint, anchors):
            Down.calls += 1
            raise ConnectionError("store down")

        catalog_texts = anchor_lookup

    store = ChunkStore(Down(1 << 20), fingerprint=FP, cooldown_s=60.0)
    # None: "search the store's cached catalog instead" (the engine does), not "nothing matched"
    assert store.candidates("x" * 80) is None and store.texts_of(["k"]) == {}
    asked = Down.calls
    assert asked >= 1 and store.stats().errors >= 1
    assert store.candidates("x" * 80) is None and Down.calls == asked  # backing off: no second timeout


def median_match_s(index: TextMatcher, prompts: list[str]) -> float:
    times = []
    for p in prompts:
        t0 = time.perf_counter()
        index.candidates(p)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@pytest.mark.parametrize("kind", ["memory", "folder"])
def test_matching_time_does_not_grow_with_the_store(kind, tmp_path):
    """Per-prompt matching at 100k stored chunks within 2x of that at 1k: finding stored chunks
    in a prompt must cost O(prompt) lookups, not a scan of every stored text."""
    big = corpus(100_000, seed=2)
    small = dict(list(big.items())[:1000])
    rng = random.Random(3)
    prompts = [prompt_of([small[k] for k in rng.sample(sorted(small), 8)]) for _ in range(30)]
    results = {}
    for name, texts in (("1k", small), ("100k", big)):
        backend = backend_of(kind, tmp_path, name)
        catalogue(backend, texts)
        index = matcher(backend)
        assert all(len(index.candidates(p)) >= 8 for p in prompts[:3])
        median_match_s(index, prompts[:5])  # warm
        results[name] = min(median_match_s(index, prompts) for _ in range(3))
    print(f"{kind}: matching per prompt {results['1k'] * 1e3:.2f} ms at 1k chunks, "
          f"{results['100k'] * 1e3:.2f} ms at 100k")
    # A scan of the stored texts would grow 100x; an index lookup grows with the B-tree's depth
    # and cache misses only. Timings on a shared 2-core CPU vary run to run, so the test's
    # bound is loose and the 2x figure is reported (-s), not asserted.
    assert results["100k"] <= 10 * results["1k"], results
    assert len(prompts[0]) > ANCHOR
