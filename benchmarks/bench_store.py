"""Load throughput of stored chunk KV: hot tier, memory backend, folder store, Redis.

Geometry defaults to SmolLM2-135M (30 layers, 3 KV heads, head_dim 64) and 512-token
chunks (11.25 MiB in fp16); ``--model`` takes the geometry (and the compile column) from any
model ``ragpic`` loads, e.g. a ``.gguf`` from ``ragpic model get``. Each tier is read through :class:`ragpic.cache.ChunkStore`
with the hot tier disabled (except the ``hot`` row), so every read decodes and verifies
the entry (sha256 + copy). Folder reads come from the OS page cache after the first
run; that is the steady state of a hot KV folder, not a cold disk.

    python benchmarks/bench_store.py [--chunks 8] [--runs 5] [--model M] [--json out.json]

Per format it also reports bytes per token of an entry and the time to encode one (quantize,
checksum, serialise: what the compiling device pays at store time); "load ms" on the memory
tier is decoding plus verifying.

Compile time: the CLI compiles one chunk of the same length with the model (the embedded
SmolLM2 unless ``--model``; in fp32 on the CPU: the dtype the model runs in here) and shows its median ms beside the load
times, so you can see when loading beats recomputing (``--no-compile`` skips it).
:func:`run` takes any ``compile_fn`` (a callable ``(dtype) -> Any``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ragpic.cache import ChunkStore, chunk_key
from ragpic.cache.backends import DiskBackend, MemoryBackend
from ragpic.cache.format.entry import encode
from ragpic.core.kv import ChunkKV

FP = "bench/smollm2-geometry"


def _chunks(n: int, layers: int, heads: int, tokens: int, head_dim: int, dtype: torch.dtype) -> dict[str, tuple[ChunkKV, str]]:
    g = torch.Generator().manual_seed(0)
    out = {}
    for i in range(n):
        shape = (layers, heads, tokens, head_dim)
        kv = ChunkKV(torch.randint(0, 49152, (tokens,), generator=g), torch.randn(shape, generator=g).to(dtype),
                     torch.randn(shape, generator=g).to(dtype), 0, FP, "plain")
        text = f"bench chunk {i}"
        out[chunk_key(FP, text, "plain", dtype)] = (kv, text)
    return out


def _time_reads(store: ChunkStore, keys: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs + 1):  # first run warms page cache / connections, not counted
        t0 = time.perf_counter()
        got = store.get_many(keys)
        times.append(time.perf_counter() - t0)
        if len(got) != len(keys):
            raise RuntimeError(f"only {len(got)}/{len(keys)} chunks read back: {store.stats()}")
    return times[1:]


def _redis_server() -> tuple[subprocess.Popen, str] | None:
    binary = shutil.which("redis-server")
    if binary is None:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            return proc, f"redis://127.0.0.1:{port}/0"
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    return None


def run(*, chunks: int = 8, runs: int = 5, tokens: int = 512, layers: int = 30, heads: int = 3, head_dim: int = 64,
        dtypes: tuple[str, ...] = ("float32", "float16"), quants: tuple[str, ...] = ("none", "int8", "int4"),
        redis_url: str | None = None, compile_fn: Callable[[torch.dtype], Any] | None = None) -> list[dict[str, Any]]:
    """Measure every (dtype, quant, tier); return one row per combination."""
    rows: list[dict[str, Any]] = []
    server = None
    if redis_url is None:
        server = _redis_server()
        redis_url = server[1] if server else None
    tmp = Path(tempfile.mkdtemp(prefix="ragpic-bench-"))
    try:
        for dname in dtypes:
            dtype = getattr(torch, dname)
            items = _chunks(chunks, layers, heads, tokens, head_dim, dtype)
            keys = list(items)
            kv_bytes = next(iter(items.values()))[0].nbytes
            compile_ms = None
            if compile_fn is not None:
                compile_fn(dtype)
                compile_ms = statistics.median(_timed(lambda: compile_fn(dtype)) for _ in range(runs)) * 1e3
            for quant in quants:
                kv0, text0 = next(iter(items.values()))
                encode_ms = statistics.median(_timed(lambda: encode(kv0, text=text0, quant=quant))
                                              for _ in range(runs)) * 1e3
                entry_bytes = len(encode(kv0, text=text0, quant=quant))
                tiers: dict[str, Callable[[], ChunkStore]] = {
                    "hot": lambda: ChunkStore(None, fingerprint=FP, memory_bytes=4 * chunks * kv_bytes, quant=quant),
                    "memory": lambda: ChunkStore(MemoryBackend(4 * chunks * kv_bytes), fingerprint=FP, memory_bytes=0, quant=quant),
                    "folder": lambda: ChunkStore(DiskBackend(tmp / f"{dname}-{quant}", 1 << 34), fingerprint=FP,
                                                    memory_bytes=0, quant=quant),
                }
                if redis_url:
                    from ragpic.cache.backends.redis.backend import RedisBackend

                    tiers["redis"] = lambda: ChunkStore(RedisBackend(redis_url, prefix=f"bench:{dname}:{quant}:"),
                                                        fingerprint=FP, memory_bytes=0, quant=quant)
                for tier, make in tiers.items():
                    if tier == "hot" and quant != "none":
                        continue
                    store = make()
                    store.put_many(items)
                    store.reset_stats()
                    med = statistics.median(_time_reads(store, keys, runs)) / chunks
                    entry = store.stats().bytes_read // max(1, store.stats().backend_hits) or kv_bytes
                    rows.append({"dtype": dname, "quant": quant, "tier": tier, "tokens": tokens,
                                 "kv_mib": kv_bytes / 2**20, "entry_mib": entry / 2**20, "ms_per_chunk": med * 1e3,
                                 "mb_per_s": kv_bytes / 1e6 / med, "compile_ms": compile_ms,
                                 "encode_ms": encode_ms, "bytes_per_token": entry_bytes / tokens})
                    store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if server:
            server[0].kill()
            server[0].wait()
    return rows


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'dtype':8} {'quant':5} {'tier':9} {'KV MiB':>7} {'entry MiB':>9} {'B/token':>8} {'encode ms':>9} "
            f"{'load ms':>8} {'KV MB/s':>9} {'compile ms':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        comp = "-" if r["compile_ms"] is None else f"{r['compile_ms']:.1f}"
        rate = "(no I/O)" if r["tier"] == "hot" else f"{r['mb_per_s']:.0f}"
        lines.append(f"{r['dtype']:8} {r['quant']:5} {r['tier']:9} {r['kv_mib']:7.2f} {r['entry_mib']:9.2f} "
                     f"{r['bytes_per_token']:8,.0f} {r['encode_ms']:9.1f} {r['ms_per_chunk']:8.2f} {rate:>9} {comp:>10}")
    return "\n".join(lines)


def model_compile_fn(lm, tokens: int) -> Callable[[torch.dtype], Any]:
    """Compile one ``tokens``-long chunk with the loaded model ``lm`` (as loaded on this device)."""
    from ragpic.core.compile import compile_chunks

    ids = [list(range(1000, 1000 + tokens))]
    return lambda _dtype: compile_chunks(lm, ids)



def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=8, help="chunks read per get_many call")
    p.add_argument("--runs", type=int, default=5, help="timed runs (median reported)")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--redis-url", default=None, help="existing server; default: start redis-server on loopback")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--json", dest="json_out", default=None, help="also write rows as JSON here")
    p.add_argument("--no-compile", action="store_true", help="skip the compile-time column")
    p.add_argument("--model", default=None, help="take geometry and compile time from this model (folder, "
                   "hub id or .gguf; default: the embedded SmolLM2-135M)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    layers, heads, head_dim, compile_fn = 30, 3, 64, None
    if args.model or not args.no_compile:
        from ragpic.core.model import load_model

        lm = load_model(args.model, device="cpu")
        layers, heads, head_dim = lm.num_layers, lm.num_kv_heads, lm.head_dim
        compile_fn = None if args.no_compile else model_compile_fn(lm, args.tokens)
    rows = run(chunks=args.chunks, runs=args.runs, tokens=args.tokens, layers=layers, heads=heads,
               head_dim=head_dim, redis_url=args.redis_url, compile_fn=compile_fn)
    name = Path(args.model).name if args.model else "SmolLM2-135M"
    print(f"{name} geometry ({layers} layers x {heads} KV heads x {head_dim}), {args.tokens}-token chunks, "
          f"{args.chunks} chunks per read, median of {args.runs}; MB/s counts decoded KV bytes")
    print(table(rows))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
