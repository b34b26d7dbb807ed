"""Shared helpers for the cache tests: deterministic random chunk KV and worker processes.

Worker functions live here (not in test modules) so ``multiprocessing`` spawn children can
import them cheaply.
"""

from __future__ import annotations

import os
import time

import torch

from ragpic.cache.format.keys import chunk_key
from ragpic.core.kv import ChunkKV

FP = "test-model@deadbeef/float32"


def make_chunk(seed: int, *, tokens: int = 8, layers: int = 2, heads: int = 2, head_dim: int = 16,
               dtype: torch.dtype = torch.float32, fingerprint: str = FP, recipe: str = "plain",
               base_position: int = 0) -> tuple[str, ChunkKV, str]:
    """``(key, kv, text)`` for a random chunk fully determined by its arguments."""
    g = torch.Generator().manual_seed(seed)
    shape = (layers, heads, tokens, head_dim)
    kv = ChunkKV(
        token_ids=torch.randint(0, 50_000, (tokens,), generator=g),
        keys=(torch.randn(shape, generator=g) * 3).to(dtype),
        values=torch.randn(shape, generator=g).to(dtype),
        base_position=base_position, fingerprint=fingerprint, recipe=recipe,
    )
    text = f"chunk {seed} · {tokens} tokens ✓"
    return chunk_key(fingerprint, text, recipe, dtype), kv, text


def same_kv(a: ChunkKV, b: ChunkKV) -> bool:
    return (torch.equal(a.token_ids, b.token_ids) and torch.equal(a.keys, b.keys)
            and torch.equal(a.values, b.values) and a.base_position == b.base_position
            and a.fingerprint == b.fingerprint and a.recipe == b.recipe and a.keys.dtype == b.keys.dtype)


def chunk_tokens(seed: int) -> int:
    """Token count by seed: mixes entries stored inline in sqlite (< 32 KiB) and as files."""
    return (4, 64, 300)[seed % 3]


def writer_process(path: str, seeds: list[int], size_limit: int) -> None:
    """Write every seed's chunk into the DiskBackend at ``path`` (one put per chunk)."""
    torch.set_num_threads(1)
    from ragpic.cache import open_store

    store = open_store(path, fingerprint=FP, memory_bytes=0, size_limit_bytes=size_limit)
    for s in seeds:
        key, kv, text = make_chunk(s, tokens=chunk_tokens(s))
        store.put_many({key: (kv, text)})
    assert store.stats().errors == 0, store.stats()
    store.close()


def endless_writer(path: str, start: int) -> None:
    """Write ~1.5 MB entries forever (until SIGKILLed), noting progress in ``path/progress``."""
    torch.set_num_threads(1)
    from ragpic.cache import open_store

    store = open_store(path, fingerprint=FP, memory_bytes=0)
    s = start
    while True:
        key, kv, text = make_chunk(s, tokens=3000, layers=4, heads=2, head_dim=16)
        store.put_many({key: (kv, text)})
        with open(os.path.join(path, "progress"), "a") as f:
            f.write(f"{s}\n")
        s += 1
        time.sleep(0)


def die_mid_write(path: str) -> None:
    """Store chunk 0, then SIGKILL this process halfway through writing chunk 1's entry file."""
    import signal

    from ragpic.cache import open_store
    from ragpic.cache.backends.disk import folder

    store = open_store(path, fingerprint=FP, memory_bytes=0)
    key, kv, text = make_chunk(0, tokens=300)
    store.put_many({key: (kv, text)})

    def half_then_die(tmp, data):  # folder._write_bytes's signature
        with open(tmp, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)

    folder._write_bytes = half_then_die
    key, kv, text = make_chunk(1, tokens=300)
    store.put_many({key: (kv, text)})
