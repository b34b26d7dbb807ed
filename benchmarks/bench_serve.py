"""Load benchmark of ``ragpic serve``: EPIC's asynchronous RAG workload against live servers.

    python benchmarks/bench_serve.py [--rates 0.25,0.5] [--requests 10] [--max-tokens 32]
        [--methods legolink-16,naive,full] [--json out.json]

Starts a redis-server and ``ragpic serve`` processes on loopback ports (embedded SmolLM2
unless ``--model``), compiles a corpus of ~300-token chunks from the bundled essays through
``POST /v1/context_cache``, then for each server set-up -- batched (``--max-batch 8``), one at a
time (``--max-batch 1``), and two batched workers on the same Redis behind a round-robin
client -- and each arrival rate and method (a per-request ``method``), runs Poisson arrivals of
RAG prompts (4-8 chunks by Zipf popularity + a question, ~2k tokens), streamed. Prints
requests/s, generated tokens/s, TTFT p50/p90/p99 and the store hit rate of each, then the
burst test: 8 requests at once, batched vs one at a time, with the memory bound
on their ratio (decode reads every weight once per step, plus each request's KV).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import run_load  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KV_BYTES_PER_TOKEN = 46_080  # SmolLM2-135M in fp32 (docs/ARCHITECTURE.md section 5)
WEIGHT_BYTES = 540e6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def corpus(words_per_chunk: int, limit: int) -> list[str]:
    """~300-token chunks (by words) of the bundled Paul Graham essays."""
    out: list[str] = []
    for path in sorted((ROOT / "ragpic/data/haystack").glob("*.txt")):
        words = path.read_text().split()
        out += [" ".join(words[i:i + words_per_chunk]) for i in range(0, len(words) - words_per_chunk, words_per_chunk)]
    return out[:limit]


class Proc:
    def __init__(self, argv: list[str], env: dict, log: Path):
        self.log = open(log, "w")
        self.p = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
        self.log.close()


def start_servers(n: int, redis_url: str, max_batch: int, args, tmp: Path) -> tuple[list[str], list[Proc]]:
    threads = args.threads or max(1, (os.cpu_count() or 2) // n)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    urls, procs = [], []
    for _ in range(n):
        port = free_port()
        argv = [sys.executable, "-m", "ragpic.cli", "serve", "--port", str(port), "--store", redis_url,
                "--max-batch", str(max_batch), "--max-queue", "256"] + (["--model", args.model] if args.model else [])
        procs.append(Proc(argv, env, tmp / f"serve-{port}.log"))
        urls.append(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 600
    for url, proc in zip(urls, procs):
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server {url} did not start: {Path(proc.log.name).read_text()[-2000:]}")
            time.sleep(0.5)
    return urls, procs


def model_id(url: str) -> str:
    return httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]


def scenario(name: str, urls: list[str], texts: list[str], args, rows: list[dict], first: bool) -> None:
    model = model_id(urls[0])
    for rate in args.rates if first or not args.rates_other else args.rates_other:
        for method in args.methods if first or not args.methods_other else args.methods_other:
            run = asyncio.run(run_load(urls, texts, model=model, method=method, rate=rate, requests=args.requests,
                                       max_tokens=args.max_tokens, seed=args.seed, deadline_s=args.deadline))
            row = {"setup": name, "rate": rate, "method": method, **run.summary()}
            rows.append(row)
            print(fmt(row), flush=True)


def burst(urls: list[str], texts: list[str], args, mode: str) -> dict:
    run = asyncio.run(run_load(urls, texts, model=model_id(urls[0]), method="legolink-16", rate=None,
                               requests=args.streams, max_tokens=args.burst_tokens, seed=args.seed + 1,
                               deadline_s=args.deadline))
    return {"setup": mode, **run.summary()}


def fmt(r: dict) -> str:
    return (f"| {r['setup']:<16} | {r['rate']!s:>5} | {r['method']:<11} | {r['ok']:>3}/{r['requests']:<3} | "
            f"{r['req_per_s']:>6.3f} | {r['gen_tok_per_s']:>7.2f} | {r['ttft_p50_s']:>7.3f} | {r['ttft_p90_s']:>7.3f} | "
            f"{r['ttft_p99_s']:>7.3f} | {r['hit_rate'] if r['method'] != 'full' else '-'!s:>5} |")


HEAD = ("| setup            |  rate | method      | ok      |  req/s |   tok/s | TTFT p50 | p90    | p99    |  hit  |\n"
        "|---|---|---|---|---|---|---|---|---|---|")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[0.25, 0.5])
    ap.add_argument("--methods", type=lambda s: s.split(","), default=["legolink-16", "naive", "full"])
    ap.add_argument("--setups", type=lambda s: s.split(","), default=["batched", "one-at-a-time", "2 workers"])
    ap.add_argument("--rates-other", type=lambda s: [float(x) for x in s.split(",")], default=None,
                    help="rates for every set-up after the first (default: --rates)")
    ap.add_argument("--methods-other", type=lambda s: s.split(","), default=None,
                    help="methods for every set-up after the first (default: --methods)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per server (0: cores / servers)")
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--streams", type=int, default=8, help="burst test: requests at once")
    ap.add_argument("--burst-tokens", type=int, default=64)
    ap.add_argument("--corpus", type=int, default=32, help="chunks in the corpus")
    ap.add_argument("--words", type=int, default=230, help="words per chunk (~300 SmolLM2 tokens)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deadline", type=float, default=900.0, help="seconds any one load run may take")
    ap.add_argument("--burst-only", action="store_true", help="only the 8-stream burst (batched vs one at a time)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="ragpic-bench-serve-"))
    rport = free_port()
    redis = Proc([shutil.which("redis-server") or "redis-server", "--port", str(rport), "--bind", "127.0.0.1",
                  "--save", "", "--appendonly", "no", "--dir", str(tmp)], dict(os.environ), tmp / "redis.log")
    redis_url = f"http://127.0.0.1:{rport}".replace("http", "redis") + "/0"
    texts = corpus(args.words, args.corpus)
    rows: list[dict] = []
    bursts: list[dict] = []
    setups = {"batched": (1, 8), "one-at-a-time": (1, 1), "2 workers": (2, 8)}
    try:
        time.sleep(0.5)
        for i, name in enumerate(args.setups):
            urls, procs = start_servers(setups[name][0], redis_url, setups[name][1], args, tmp)
            try:
                if i == 0:
                    t0 = time.perf_counter()
                    r = httpx.post(urls[0] + "/v1/context_cache", json={"texts": texts}, timeout=1800)
                    r.raise_for_status()
                    print(f"compiled {r.json()['compiled']} chunks in {time.perf_counter() - t0:.1f} s", flush=True)
                    print(HEAD)
                if name in ("batched", "one-at-a-time"):
                    bursts.append(burst(urls, texts, args, name))
                if not args.burst_only:
                    scenario(name, urls, texts, args, rows, first=i == 0)
            finally:
                for p in procs:
                    p.stop()
    finally:
        redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    report_burst(bursts, args, texts)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "burst": bursts, "args": vars(args)}, indent=1))
    return 0


def report_burst(bursts: list[dict], args, texts: list[str]) -> None:
    by = {b["setup"]: b for b in bursts}
    if set(by) != {"batched", "one-at-a-time"}:
        return
    prompt_tokens = 6 * args.words * 1.3  # 4-8 chunks, ~1.3 SmolLM2 tokens per word
    kv = KV_BYTES_PER_TOKEN * prompt_tokens
    b = args.streams
    bound = b * (WEIGHT_BYTES + kv) / (WEIGHT_BYTES + b * kv)
    ratio = by["batched"]["gen_tok_per_s"] / max(1e-9, by["one-at-a-time"]["gen_tok_per_s"])
    print(f"\nburst: {b} streams at once (legolink-16, ~{prompt_tokens:.0f}-token prompts, {args.burst_tokens} tokens): "
          f"batched {by['batched']['gen_tok_per_s']:.2f} tok/s, one at a time "
          f"{by['one-at-a-time']['gen_tok_per_s']:.2f} tok/s: {ratio:.2f}x (memory bound {bound:.2f}x: "
          f"{b} x (weights {WEIGHT_BYTES / 1e6:.0f} MB + KV {kv / 1e6:.0f} MB) / (weights + {b} x KV))")


if __name__ == "__main__":
    sys.exit(main())
