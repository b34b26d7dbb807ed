"""Ingest rate: compile throughput of 512-token chunks against the model's own prefill rate.

On the embedded SmolLM2 (fp32 on the CPU unless ``--dtype``), the bundled essays are cut
into ``--chunks`` chunks of ~``--chunk-tokens`` tokens (extended to a sentence end, so their
lengths differ as real chunks do). Measured side by side on the same token ids, medians of
``--repeats`` interleaved runs:

- ``prefill``: each chunk prefilled alone (batch 1), the rate a plain transformers forward gives;
- ``compile``: :func:`ragpic.core.compile.compile_chunks` (length-sorted, right-padded
  batches of at most ``--batch-tokens`` padded tokens), with its padding waste;
- ``store <format>``: quantize + encode + write of those chunks into a fresh folder store;
- ``ingest``: ``RagPic.compile`` end to end into a fresh folder store (tokenize, compile,
  store, index), with the store write's share of it.

    python benchmarks/bench_ingest.py --chunks 16 --repeats 3 --threads 2 --json docs/results/bench_ingest.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers.cache_utils import DynamicCache

import ragpic
from ragpic.cache.format.keys import chunk_key
from ragpic.cache.store.opening import open_store
from ragpic.core.compile import _batches, compile_chunks
from ragpic.core.runner import runner_for
from ragpic.core.model import LoadedModel, load_model
from ragpic.eval.data import load_haystack
from ragpic.eval.needle import chunk_text

FORMATS = ("none", "int8", "int4")


def corpus(lm: LoadedModel, n: int, chunk_tokens: int) -> list[str]:
    text = load_haystack(Path(ragpic.__file__).parent / "data" / "haystack")
    chunks = chunk_text(lm.tokenizer, text, chunk_tokens)
    if len(chunks) < n:
        raise SystemExit(f"--chunks {n}: the bundled essays give only {len(chunks)} chunks of {chunk_tokens} tokens")
    return chunks[:n]


@torch.inference_mode()
def time_prefill(lm: LoadedModel, ids: list[list[int]]) -> float:
    t0 = time.perf_counter()
    for seq in ids:
        x = torch.tensor(seq, device=lm.device)[None]
        runner_for(lm).prefill(x, torch.arange(x.shape[1], device=lm.device)[None], DynamicCache())
    return time.perf_counter() - t0


def time_compile(lm: LoadedModel, ids: list[list[int]], batch_tokens: int) -> tuple[float, list]:
    t0 = time.perf_counter()
    kvs = compile_chunks(lm, ids, batch_tokens=batch_tokens)
    return time.perf_counter() - t0, kvs


def time_store(lm: LoadedModel, kvs: list, texts: list[str], quant: str) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as d:
        store = open_store(Path(d) / "kv", fingerprint=lm.fingerprint, quant=quant)
        items = {chunk_key(lm.fingerprint, t, "plain", lm.dtype): (kv.to("cpu"), t) for kv, t in zip(kvs, texts)}
        t0 = time.perf_counter()
        store.put_many(items, strict=True)
        dt = time.perf_counter() - t0
        written = store.stats().bytes_written
        store.close()
    return dt, written


def time_ingest(lm: LoadedModel, texts: list[str]) -> float:
    with tempfile.TemporaryDirectory() as d:
        rp = ragpic.RagPic(ragpic.Config(store=str(Path(d) / "kv")), lm=lm)
        t0 = time.perf_counter()
        rp.compile(texts)
        dt = time.perf_counter() - t0
        rp.store.close()
    return dt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--chunk-tokens", type=int, default=512)
    p.add_argument("--batch-tokens", type=int, default=ragpic.Config().batch_tokens)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--dtype", default=None, help="model dtype (default: fp32 on the CPU)")
    p.add_argument("--json", type=Path, help="write the figures as JSON")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model(None, dtype=args.dtype)
    texts = corpus(lm, args.chunks, args.chunk_tokens)
    ids = [lm.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    tokens = sum(len(i) for i in ids)
    batches = _batches([len(i) for i in ids], args.batch_tokens)
    padded = sum(max(len(ids[i]) for i in b) * len(b) for b in batches)
    waste = padded / tokens - 1
    print(f"{len(ids)} chunks, {tokens} tokens ({min(map(len, ids))}-{max(map(len, ids))} per chunk); "
          f"{len(batches)} compile batches, padding waste {100 * waste:.1f}%", file=sys.stderr, flush=True)
    times: dict[str, list[float]] = {"prefill": [], "compile": [], "ingest": [], **{f"store {q}": [] for q in FORMATS}}
    written: dict[str, int] = {}
    time_compile(lm, ids[:2], args.batch_tokens)  # warm-up
    for r in range(args.repeats):
        times["prefill"].append(time_prefill(lm, ids))
        dt, kvs = time_compile(lm, ids, args.batch_tokens)
        times["compile"].append(dt)
        for q in FORMATS:
            dt, written[q] = time_store(lm, kvs, texts, q)
            times[f"store {q}"].append(dt)
        times["ingest"].append(time_ingest(lm, texts))
        print(f"repeat {r + 1}/{args.repeats}: " + "  ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()),
              file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = []
    for k, s in med.items():
        row = {"step": k, "median_s": s, "tokens_per_s": tokens / s, "chunks_per_s": len(ids) / s}
        if k.startswith("store"):
            q = k.split()[1]
            row["bytes_per_token"] = written[q] / tokens
            row["share_of_ingest"] = s / med["ingest"]
        rows.append(row)
    print(f"{'step':<12}{'median s':>10}{'tokens/s':>10}{'chunks/s':>10}{'B/token':>10}{'of ingest':>11}")
    for row in rows:
        extra = (f"{row['bytes_per_token']:>10.0f}{100 * row['share_of_ingest']:>10.1f}%"
                 if "bytes_per_token" in row else "")
        print(f"{row['step']:<12}{row['median_s']:>10.2f}{row['tokens_per_s']:>10.0f}{row['chunks_per_s']:>10.2f}{extra}")
    print(f"compile / prefill rate: {med['prefill'] / med['compile']:.2f}x; padding waste {100 * waste:.1f}%")
    if args.json:
        args.json.write_text(json.dumps({
            "config": {"chunks": len(ids), "tokens": tokens, "chunk_tokens": args.chunk_tokens,
                       "batch_tokens": args.batch_tokens, "batches": len(batches), "padding_waste": waste,
                       "repeats": args.repeats, "model": lm.name, "dtype": str(lm.dtype),
                       "torch_threads": torch.get_num_threads()},
            "rows": rows, "runs": times}, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
