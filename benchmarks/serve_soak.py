"""A soak of one ``ragpic serve`` on a Redis store: does anything grow, leak or break over half an hour?

    python benchmarks/serve_soak.py --rate 0.5 [--minutes 30] [--model 0.5b] [--json out.json]
    python benchmarks/serve_soak.py --tiny --json out.json     # a minute on the embedded SmolLM2

One ``redis-server`` (append-only file, so a restart keeps what it stored) and one ``ragpic
serve --store redis://...`` on loopback ports; the corpus and workload of
``serve_vs_llamacpp.py`` (the first half of the corpus compiled ahead), then for ``--minutes``:

- Poisson arrivals at ``--rate`` requests/s (seeded), each a streamed RAG chat request; of them
  10% close their stream after the third delta (a client that leaves) and 5% are bad (no
  messages, a negative ``max_tokens``, an unknown role), which must get a 4xx;
- every ``--compile-every`` seconds a ``POST /v1/context_cache`` of the corpus's next 4 chunks
  (new documents arriving), which later requests draw from;
- at the half-way mark, Redis is stopped (SIGTERM) and started again on the same port and files.

Every 30 s: the server's RSS, its ``/health`` gauges (active, queued, compiling), the store hit
rate over the window (``/metrics``) and the window's p95 TTFT. At the end the gauges must be back
to 0 and ``ragpic store check`` must find the store clean. The JSON holds every sample and the
verdicts: RSS growth after the first 5 minutes, 5xx count, last-5-minutes p95 TTFT against the
first 5 minutes', and the requests that failed around the Redis restart.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_vs_llamacpp import ROOT, Server, compile_corpus, corpus, free_port, pct, resolve_model, workload  # noqa: E402

BAD = [{"messages": []}, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -3},
       {"messages": [{"role": "wizard", "content": "hi"}]}]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def counter(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^ragpic_{name}_total(?:{{[^}}]*}})? (\S+)$", text, re.M))


def bounded_mb(text: str) -> float:
    """MB in the server's bounded memories (the store's hot tier and the idle cache slabs, from
    ``/metrics``): what a growing RSS holds before anything can be called a leak."""
    found = re.findall(r"^ragpic_(?:store_memory_bytes|cache_pool_idle_bytes) (\S+)$", text, re.M)
    return round(sum(float(v) for v in found) / 2**20, 1)


class Redis:
    def __init__(self, tmp: Path):
        self.port, self.tmp, self.p = free_port(), tmp, None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.p = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(self.port),
                                   "--bind", "127.0.0.1", "--dir", str(self.tmp), "--save", "", "--appendonly", "yes",
                                   "--appendfsync", "always"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.2):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.p and self.p.poll() is None:
            self.p.terminate()
            self.p.wait(30)


async def request(client: httpx.AsyncClient, url: str, model: str, kind: str, messages: list[dict],
                  max_tokens: int) -> dict:
    body = ({"model": model, **random.Random(len(messages[1]["content"])).choice(BAD)} if kind == "bad" else
            {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True})
    t0, rec = time.perf_counter(), {"kind": kind, "status": 0, "ttft_s": None, "t": time.time()}
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            rec["status"] = r.status_code
            if r.status_code != 200:
                rec["error"] = (await r.aread()).decode()[:200]
                return rec
            deltas = 0
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    ev = json.loads(line[6:])
                    if "error" in ev:
                        rec["error"] = str(ev["error"])[:200]
                    if (ev.get("choices") or [{}])[0].get("delta", {}).get("content"):
                        deltas += 1
                        if rec["ttft_s"] is None:
                            rec["ttft_s"] = time.perf_counter() - t0
                        if kind == "drop" and deltas >= 3:
                            return rec  # the client leaves mid-stream
            rec["done"] = True
    except Exception as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"[:200]
    return rec


async def soak(args, server: Server, redis: Redis, chunks: list[str], first: int) -> dict:
    rng = random.Random(args.seed)
    model = server.model()
    records: list[dict] = []
    samples: list[dict] = []
    events: list[dict] = []
    known = first  # chunks compiled so far: requests draw from them
    t_start = time.perf_counter()
    end = t_start + args.minutes * 60
    restart_at = t_start + args.minutes * 30
    restarted = False
    tasks: set[asyncio.Task] = set()
    async with httpx.AsyncClient(timeout=args.timeout, limits=httpx.Limits(max_connections=256)) as client:
        async def sampler() -> None:
            last_hits = last_misses = 0.0
            while True:
                await asyncio.sleep(args.sample_s)
                try:
                    health = (await client.get(server.url + "/health", timeout=10)).json()
                    text = (await client.get(server.url + "/metrics", timeout=10)).text
                except Exception as exc:  # the server must answer these throughout
                    samples.append({"t_s": round(time.perf_counter() - t_start, 1), "error": str(exc)[:200]})
                    continue
                hits, misses = counter(text, "cache_hits"), counter(text, "cache_misses")
                window = [r["ttft_s"] for r in records if r["ttft_s"] is not None and r["kind"] == "ok"
                          and r["t"] > time.time() - args.sample_s]
                dh, dm = hits - last_hits, misses - last_misses
                last_hits, last_misses = hits, misses
                samples.append({"t_s": round(time.perf_counter() - t_start, 1), "rss_mb": round(rss_mb(server.p.pid), 1),
                                "active": health.get("active"), "queued": health.get("queued"),
                                "compiling": health.get("compiling"), "in_flight": len(tasks),
                                "bounded_mb": bounded_mb(text),
                                "hit_rate": round(dh / (dh + dm), 3) if dh + dm else None, "ttft_p95_s": pct(window, 95)})
                print(f"[soak] {samples[-1]}", file=sys.stderr, flush=True)

        async def compiler() -> None:
            nonlocal known
            while known < len(chunks):
                await asyncio.sleep(args.compile_every)
                new = chunks[known:known + 4]
                try:
                    r = await client.post(server.url + "/v1/context_cache", json={"texts": new}, timeout=600)
                    events.append({"t_s": round(time.perf_counter() - t_start, 1), "compile": r.status_code})
                    if r.status_code == 200:
                        known += len(new)
                except Exception as exc:
                    events.append({"t_s": round(time.perf_counter() - t_start, 1), "compile_error": str(exc)[:200]})

        side = [asyncio.create_task(sampler()), asyncio.create_task(compiler())]
        i = 0
        while time.perf_counter() < end:
            await asyncio.sleep(rng.expovariate(args.rate))
            if not restarted and time.perf_counter() >= restart_at:
                restarted = True
                events.append({"t_s": round(time.perf_counter() - t_start, 1), "redis": "stop",
                               "in_flight": len(tasks)})
                await asyncio.to_thread(redis.stop)
                await asyncio.sleep(3)
                await asyncio.to_thread(redis.start)
                events.append({"t_s": round(time.perf_counter() - t_start, 1), "redis": "started"})
            u = rng.random()
            kind = "bad" if u < 0.05 else "drop" if u < 0.15 else "ok"
            messages = workload(chunks[:known], 1, args.seed * 100003 + i, args.lo, args.hi)[0]
            i += 1
            task = asyncio.create_task(request(client, server.url, model, kind, messages, args.max_tokens))
            tasks.add(task)
            task.add_done_callback(lambda t: (tasks.discard(t), records.append(t.result())))
        if tasks:
            await asyncio.wait(tasks, timeout=args.timeout)
        for t in side:
            t.cancel()
        await asyncio.sleep(2)  # a dropped stream's request ends at its next step
        final = (await client.get(server.url + "/health", timeout=10)).json()
        final_bounded = bounded_mb((await client.get(server.url + "/metrics", timeout=10)).text)
    return {"records": records, "samples": samples, "events": events, "final_gauges": final,
            "final_rss_mb": round(rss_mb(server.p.pid), 1), "final_bounded_mb": final_bounded,
            "wall_s": round(time.perf_counter() - t_start, 1)}


def verdicts(res: dict, minutes: float) -> dict:
    recs, samples = res["records"], [s for s in res["samples"] if "rss_mb" in s]
    t0 = min((r["t"] for r in recs), default=0)
    early = [r["ttft_s"] for r in recs if r["kind"] == "ok" and r["ttft_s"] and r["t"] - t0 < 300]
    late = [r["ttft_s"] for r in recs if r["kind"] == "ok" and r["ttft_s"] and r["t"] - t0 > minutes * 60 - 300]
    at5_sample = next((s for s in samples if s["t_s"] >= min(300, minutes * 30)), None)
    at5 = at5_sample["rss_mb"] if at5_sample else None
    # what the bounded memories (hot tier, idle slabs) took on after 5 minutes: RSS growth
    # beyond it is what no bound explains
    caches = res.get("final_bounded_mb", 0.0) - (at5_sample or {}).get("bounded_mb", 0.0)
    half = next((s["rss_mb"] for s in samples if s["t_s"] >= minutes * 30), None)
    stop = next((e["t_s"] for e in res["events"] if e.get("redis") == "stop"), None)
    ok_fail = [r for r in recs if r["kind"] == "ok" and not r.get("done")]
    return {"requests": len(recs), "by_kind": {k: sum(r["kind"] == k for r in recs) for k in ("ok", "drop", "bad")},
            "http_5xx": sum(r["status"] >= 500 for r in recs), "bad_not_4xx": sum(r["kind"] == "bad" and not 400 <= r["status"] < 500 for r in recs),
            "ok_failed": len(ok_fail), "ok_failed_errors": [r.get("error", "") for r in ok_fail][:5],
            "rss_at_5min_mb": at5, "rss_end_mb": res["final_rss_mb"],
            "rss_growth_after_5min": round(res["final_rss_mb"] / at5 - 1, 4) if at5 else None,
            "rss_growth_second_half": round(res["final_rss_mb"] / half - 1, 4) if half else None,
            "bounded_caches_growth_after_5min_mb": round(caches, 1),
            "rss_growth_after_5min_beyond_caches": round((res["final_rss_mb"] - caches) / at5 - 1, 4) if at5 else None,
            "ttft_p95_first5_s": pct(early, 95), "ttft_p95_last5_s": pct(late, 95),
            "gauges_end": {k: res["final_gauges"].get(k) for k in ("active", "queued", "compiling", "decoding")},
            "redis_stop_t_s": stop}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="0.5b")
    ap.add_argument("--rate", type=float, default=0.5, help="requests/s (Poisson): ~70%% of the server's saturation")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile-every", type=float, default=60.0, help="seconds between compiles of 4 new chunks")
    ap.add_argument("--sample-s", type=float, default=30.0)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--corpus", type=int, default=160)
    ap.add_argument("--words", type=int, default=250)
    ap.add_argument("--lo", type=int, default=6)
    ap.add_argument("--hi", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--tiny", action="store_true", help="a minute on the embedded SmolLM2")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.tiny:
        args.model, args.minutes, args.rate, args.compile_every, args.sample_s = "embedded", 1.0, 1.0, 10.0, 10.0
        args.max_tokens, args.corpus, args.words, args.lo, args.hi = 8, 24, 120, 2, 3
    model_arg, _ = resolve_model(args.model)
    chunks = corpus(args.words, args.corpus)
    first = len(chunks) // 2
    tmp = Path(tempfile.mkdtemp(prefix="ragpic-soak-"))
    redis = Redis(tmp)
    redis.start()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(ROOT)}
    port = free_port()
    server = Server([sys.executable, "-m", "ragpic.cli", "serve", "--port", str(port), "--store", redis.url,
                     "--max-queue", "256"] + (["--model", model_arg] if model_arg else []), env, tmp / "serve.log", port)
    try:
        server.wait_ready()
        compile_s = compile_corpus(server, chunks[:first])
        res = asyncio.run(soak(args, server, redis, chunks, first))
    finally:
        server.stop()
    check = subprocess.run([sys.executable, "-m", "ragpic.cli", "store", "check", redis.url], env=env,
                           capture_output=True, text=True, timeout=600)
    redis.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    out = {"verdicts": verdicts(res, args.minutes), "store_check": {"rc": check.returncode, "out": check.stdout[-1500:]},
           "compile_s": round(compile_s, 1), "args": vars(args), **{k: res[k] for k in ("samples", "events", "wall_s")},
           "records": res["records"]}
    print(json.dumps(out["verdicts"], indent=1))
    print(f"store check: rc={check.returncode}\n{check.stdout[-600:]}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    v = out["verdicts"]
    return 0 if v["http_5xx"] == 0 and v["bad_not_4xx"] == 0 and check.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
