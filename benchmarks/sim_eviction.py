"""Eviction under a skewed workload: a folder store smaller than its corpus, Zipf requests.

Each request asks a real :class:`ragpic.cache.ChunkStore` over a real folder store (hot tier
off, so every read goes to the folder, and the folder's byte budget and LRU evict) for one
chunk drawn from a Zipf(``s``) popularity over ``--corpus`` chunks; a miss is a recompile:
the chunk is put back (evicting the least recently used entries past the budget). Entries
are synthetic KV of one geometry (``--tokens`` tokens, SmolLM2's 30 layers x 3 heads x 64
dims unless told), all the same size, stored as ``--quant``.

Reported per (s, budget): hit rate, recompiles, evictions, and two references computed on the
same request sequence: an in-process LRU of the same capacity (what the folder's LRU should
match) and the static top-k of the popularity distribution (the best a cache that keeps a
fixed set can do on independent Zipf requests). The Zipf weights, the LRU and the top-k are
:mod:`ragpic.cache.tools.plan`'s, the ones ``ragpic store plan`` reports.

    python benchmarks/sim_eviction.py --corpus 400 --requests 4000 --json docs/results/sim_eviction.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from ragpic.cache import ChunkStore, chunk_key
from ragpic.cache.backends import DiskBackend
from ragpic.cache.tools.zipf import lru_hits, top_k_hit_rate, zipf_weights  # one Zipf for both
from ragpic.core.kv import ChunkKV

FP = "sim/eviction"


def make_entry(i: int, args: argparse.Namespace) -> tuple[str, tuple[ChunkKV, str]]:
    g = torch.Generator().manual_seed(i)
    shape = (args.layers, args.heads, args.tokens, args.head_dim)
    kv = ChunkKV(torch.randint(0, 49152, (args.tokens,), generator=g), torch.randn(shape, generator=g),
                 torch.randn(shape, generator=g), 0, FP, "plain")
    text = f"sim chunk {i:06d}"  # one width: every entry the same size
    return chunk_key(FP, text, "plain", torch.float32), (kv, text)


def stored_size(entry: tuple[str, tuple[ChunkKV, str]], quant: str) -> int:
    """Bytes one entry takes against a folder store's budget (its file, as the catalog counts it)."""
    with tempfile.TemporaryDirectory() as d:
        backend = DiskBackend(Path(d) / "kv", fingerprint=FP)
        store = ChunkStore(backend, fingerprint=FP, memory_bytes=0, quant=quant)
        store.put_many(dict([entry]))
        size = backend.stats()["volume_bytes"]
        store.close()
    return size


def run(args: argparse.Namespace, s: float, budget: float, entries: dict[int, tuple[str, tuple[ChunkKV, str]]],
        entry_bytes: int) -> dict:
    rng = random.Random(args.seed)
    weights = zipf_weights(args.corpus, s)
    order = list(range(args.corpus))
    rng.shuffle(order)  # popularity rank -> chunk id, so rank is not key order
    requests = [order[i] for i in rng.choices(range(args.corpus), weights=weights, k=args.requests)]
    limit = int(budget * args.corpus * entry_bytes)
    capacity = limit // entry_bytes
    with tempfile.TemporaryDirectory() as d:
        backend = DiskBackend(Path(d) / "kv", size_limit_bytes=limit, fingerprint=FP)
        store = ChunkStore(backend, fingerprint=FP, memory_bytes=0, quant=args.quant)
        recompiles = 0
        t0 = time.perf_counter()
        for i, r in enumerate(requests):
            key, item = entries[r]
            if not store.get_many([key]):
                recompiles += 1
                store.put_many({key: item})
            if args.progress and (i + 1) % 1000 == 0:
                print(f"  s={s} budget={budget:.0%}: {i + 1}/{len(requests)} requests", file=sys.stderr, flush=True)
        seconds = time.perf_counter() - t0
        stats, evictions, stored = store.stats(), backend.evictions, backend.stats()
        store.close()
    hits = stats.hits
    top = top_k_hit_rate(args.corpus, s, capacity)
    return {"zipf_s": s, "budget_fraction": budget, "budget_bytes": limit, "capacity_entries": capacity,
            "requests": len(requests), "hits": hits, "hit_rate": hits / len(requests), "recompiles": recompiles,
            "evictions": evictions, "stored_bytes_at_end": stored["volume_bytes"],
            "lru_reference_hit_rate": lru_hits(requests, capacity) / len(requests),
            "static_top_k_hit_rate": top, "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=int, default=400)
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--zipf", default="0.8,1.1", help="comma list of Zipf exponents")
    p.add_argument("--budgets", default="0.1,0.25", help="comma list: store budget as a fraction of the corpus")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--quant", default="int4", choices=("none", "int8", "int4"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--progress", action="store_true")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    entries = {i: make_entry(i, args) for i in range(args.corpus)}
    entry_bytes = stored_size(entries[0], args.quant)
    rows = [run(args, float(s), float(b), entries, entry_bytes)
            for s in args.zipf.split(",") for b in args.budgets.split(",")]
    print(f"{args.corpus} chunks of {entry_bytes} bytes ({args.quant}), {args.requests} Zipf requests")
    print(f"{'zipf s':>7}{'budget':>8}{'hit rate':>10}{'LRU ref':>9}{'top-k':>8}{'recompiles':>12}{'evictions':>11}"
          f"{'in budget':>11}")
    for r in rows:
        print(f"{r['zipf_s']:>7}{r['budget_fraction']:>8.0%}{r['hit_rate']:>10.3f}{r['lru_reference_hit_rate']:>9.3f}"
              f"{r['static_top_k_hit_rate']:>8.3f}{r['recompiles']:>12}{r['evictions']:>11}"
              f"{r['stored_bytes_at_end'] <= r['budget_bytes']!s:>11}")
    if args.json:
        args.json.write_text(json.dumps({"config": vars(args) | {"json": str(args.json), "entry_bytes": entry_bytes},
                                         "rows": rows}, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
