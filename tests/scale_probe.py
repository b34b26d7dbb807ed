"""Fill a folder store with N entries of a tiny model, or open it in a fresh process and measure.

Used by ``test_store_scale.py`` (docs/RESULTS.md §11). ``fill`` writes entries through the real
store and its catalog of texts and anchors (``ChunkStore.put_many``, what ``compile`` does)
with correctly shaped KV and each text's real token ids, so the entries pass every check a
query makes; the KV values are random (the test measures cost, not answers). ``probe`` runs
in a new interpreter so its resident memory is this process's own: it opens the store the
way a user does (``RagPic(Config(store=...))``), answers prompts without hints (found by the
text index, loaded from the folder) and compiles an already-stored sample, then prints one
JSON line of timings and memory. ``race`` times opening and querying several stores in
alternating rounds in one process.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

WORDS = ("the quick brown fox jumps over lazy dog needle hides in haystack near dolores park question "
         "what best thing san francisco answer eat sandwich sit sun passages compiled once linked").split()
SMALL = dict(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, num_key_value_heads=1,
             intermediate_size=32)  # KV: 1 layer x 1 head x 8 dims -> ~4 KB per entry


def text_of(i: int) -> str:
    rng = random.Random(i)
    return f"doc {i}: " + " ".join(rng.choice(WORDS) for _ in range(10)) + "."  # ~47 tokens


def small_lm():
    from tiny import tiny_lm

    return tiny_lm(**SMALL)  # seeded: every process builds the same weights, so the same fingerprint


def engine_on(folder: str, lm):
    from ragpic import Config, RagPic

    return RagPic(Config(store=folder, memory_cache_mb=0, store_size_limit_gb=64), lm=lm)


def fill(folder: str, lo: int, hi: int) -> None:
    """Store entries ``lo .. hi-1`` (several processes may fill one folder at once)."""
    from ragpic.core.kv import ChunkKV

    engine = engine_on(folder, small_lm())
    lm, recipe = engine.lm, engine.method_of().recipe
    layers, heads, dim = lm.num_layers, lm.num_kv_heads, lm.head_dim
    g = torch.Generator().manual_seed(lo)
    for start in range(lo, hi, 2000):
        batch = {}
        texts = [text_of(i) for i in range(start, min(hi, start + 2000))]
        for text, ids in zip(texts, lm.tokenizer(texts, add_special_tokens=False)["input_ids"]):
            ids = torch.tensor(ids)
            shape = (layers, heads, len(ids), dim)
            kv = ChunkKV(token_ids=ids, keys=torch.randn(shape, generator=g), values=torch.randn(shape, generator=g),
                         base_position=0, fingerprint=lm.fingerprint, recipe=recipe)
            batch[engine.chunk_key(text)] = (kv, text)
        engine.store.put_many(batch, strict=True)  # catalogues texts and anchors with the entries
    engine.store.close()


def rss_bytes() -> int:
    """This process's private resident memory (``RssAnon``: heap, tensors, Python objects).
    Pages of the memory-mapped text index count in ``VmRSS`` as well, but they are the OS's
    page cache, shared by every worker and reclaimable, so they are not this process's growth."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status (Linux only)")


def probe(folder: str, n: int, queries: int = 20) -> dict:
    rng = random.Random(7)
    lm = small_lm()
    engine_on(folder, lm).store.close()  # warm the imports and the OS file cache; not measured
    before = rss_bytes()
    opens = []
    for _ in range(5):
        t0 = time.perf_counter()
        engine = engine_on(folder, lm)
        opens.append(time.perf_counter() - t0)
        if len(opens) < 5:
            engine.store.close()
    prompts = ["Use the passages.\n\n" + "\n\n".join(text_of(rng.randrange(n)) for _ in range(8)) + "\n\nQuestion: where?"
               for _ in range(queries)]
    medians, loaded = [], 0
    for _ in range(3):  # the best of three rounds: a shared CPU's noise only ever adds time
        times = []
        for p in prompts:
            t0 = time.perf_counter()
            _, stats = engine.segments(engine.format_prompt(p))
            times.append(time.perf_counter() - t0)
            loaded += stats.loaded
        medians.append(statistics.median(times))
    sample = [text_of(i) for i in rng.sample(range(n), min(n, 2000))]
    t0 = time.perf_counter()
    compiled = engine.compile(sample)
    compile_s = time.perf_counter() - t0
    growth = rss_bytes() - before
    # The control: what holding every stored text (the old catalog copy) would have cost.
    held = engine.store.texts(refresh=True)
    return {"n": n, "open_s": min(opens), "query_s": min(medians), "loaded": loaded,
            "queries": 3 * queries, "compiled": compiled, "compile_stored_s": compile_s, "rss_growth": growth,
            "catalog_rss": rss_bytes() - before - growth, "catalog_rows": len(held),
            "entries": engine.store.backend.stats()["entries"]}


def race(folders: list[str], sizes: list[int], rounds: int = 5, queries: int = 20) -> dict:
    """Open time and per-query time of each store, measured in alternating rounds in one
    process (a drifting shared CPU then slows every store alike): the best round of each."""
    lm = small_lm()
    rng = random.Random(11)
    prompts = {f: ["Use the passages.\n\n" + "\n\n".join(text_of(rng.randrange(n)) for _ in range(8))
                   for _ in range(queries)] for f, n in zip(folders, sizes)}
    engines = {f: engine_on(f, lm) for f in folders}  # warm: imports, OS file cache
    best = {f: {"open_s": float("inf"), "query_s": float("inf")} for f in folders}
    for _ in range(rounds):
        for f in folders:
            engines[f].store.close()
            t0 = time.perf_counter()
            engines[f] = engine_on(f, lm)
            best[f]["open_s"] = min(best[f]["open_s"], time.perf_counter() - t0)
            times = []
            for p in prompts[f]:
                t0 = time.perf_counter()
                engines[f].segments(engines[f].format_prompt(p))
                times.append(time.perf_counter() - t0)
            best[f]["query_s"] = min(best[f]["query_s"], statistics.median(times))
    return {str(n): best[f] for f, n in zip(folders, sizes)}


if __name__ == "__main__":
    what, folder = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    if what == "fill":
        fill(folder, int(sys.argv[3]), int(sys.argv[4]))
    elif what == "race":
        print(json.dumps(race(sys.argv[2::2], [int(n) for n in sys.argv[3::2]])))
    else:
        print(json.dumps(probe(folder, int(sys.argv[3]))))
