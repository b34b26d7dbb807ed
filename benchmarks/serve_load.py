"""The client half of ``bench_serve.py``: an asynchronous RAG workload against live servers.

Poisson arrivals at a rate (seeded), each request a RAG prompt of 4-8 corpus chunks drawn by
Zipf popularity plus a question, streamed over SSE, round-robin over the server URLs (the
load balancer). Bounded: at most ``max_in_flight`` open requests and a wall-clock deadline;
it stops by itself. Loopback only.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field

import httpx

QUESTIONS = ["What is the main argument of these passages?", "Summarize what the author says about startups.",
             "What advice do the passages give?", "Which example does the author use, and why?"]


def zipf_pick(rng: random.Random, n: int, k: int, s: float = 1.1) -> list[int]:
    """``k`` distinct indices in ``[0, n)`` drawn with weight ``1 / (rank + 1) ** s``."""
    weights = [1 / (i + 1) ** s for i in range(n)]
    picked: list[int] = []
    while len(picked) < k:
        i = rng.choices(range(n), weights)[0]
        if i not in picked:
            picked.append(i)
    return picked


def rag_messages(corpus: list[str], rng: random.Random, lo: int = 4, hi: int = 8) -> list[dict]:
    chunks = [corpus[i] for i in zipf_pick(rng, len(corpus), rng.randint(lo, hi))]
    q = rng.choice(QUESTIONS)
    return [{"role": "user", "content": "Answer using the passages.\n\n" + "\n\n".join(chunks) + f"\n\nQuestion: {q}"}]


@dataclass
class Result:
    ttft_s: float | None = None
    done_s: float | None = None
    tokens: int = 0
    matched: int = 0
    loaded: int = 0
    status: int = 0


@dataclass
class Run:
    results: list[Result] = field(default_factory=list)
    wall_s: float = 0.0

    def summary(self) -> dict:
        ok = [r for r in self.results if r.status == 200 and r.done_s is not None]
        ttft = sorted(r.ttft_s for r in ok if r.ttft_s is not None)

        def pct(p: float) -> float:
            return ttft[min(len(ttft) - 1, int(round(p / 100 * (len(ttft) - 1))))] if ttft else float("nan")

        toks = sum(r.tokens for r in ok)
        matched = sum(r.matched for r in ok)
        return {"requests": len(self.results), "ok": len(ok), "wall_s": round(self.wall_s, 2),
                "req_per_s": round(len(ok) / self.wall_s, 3) if self.wall_s else 0.0,
                "gen_tok_per_s": round(toks / self.wall_s, 2) if self.wall_s else 0.0,
                "ttft_p50_s": round(pct(50), 3), "ttft_p90_s": round(pct(90), 3), "ttft_p99_s": round(pct(99), 3),
                "ttft_mean_s": round(statistics.fmean(ttft), 3) if ttft else float("nan"),
                "hit_rate": round(sum(r.loaded for r in ok) / matched, 3) if matched else 0.0}


async def one(client: httpx.AsyncClient, url: str, body: dict, t_start: float) -> Result:
    res = Result()
    t0 = time.perf_counter()
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        res.status = r.status_code
        if r.status_code != 200:
            await r.aread()
            return res
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            choices = event.get("choices") or []
            if res.ttft_s is None and choices and (choices[0].get("delta") or {}).get("content"):
                res.ttft_s = time.perf_counter() - t0
            if event.get("usage"):
                res.tokens = event["usage"]["completion_tokens"]
                res.matched, res.loaded = event["ragpic"]["chunks_matched"], event["ragpic"]["chunks_loaded"]
                if res.ttft_s is None:
                    res.ttft_s = event["ragpic"]["ttft_s"]
    res.done_s = time.perf_counter() - t_start
    return res


async def run_load(urls: list[str], corpus: list[str], *, model: str, method: str, rate: float | None,
                   requests: int, max_tokens: int, seed: int = 0, max_in_flight: int = 32,
                   deadline_s: float = 600.0) -> Run:
    """``rate`` requests/s Poisson arrivals (None: all at once, a burst); returns every result."""
    rng = random.Random(seed)
    bodies = [{"model": model, "messages": rag_messages(corpus, rng), "max_tokens": max_tokens, "stream": True,
               "stream_options": {"include_usage": True}, "method": method, "temperature": 0}
              for _ in range(requests)]
    gaps = [0.0] + [rng.expovariate(rate) if rate else 0.0 for _ in range(requests - 1)]
    gate = asyncio.Semaphore(max_in_flight)
    run = Run()
    t_start = time.perf_counter()
    async with httpx.AsyncClient(timeout=deadline_s, limits=httpx.Limits(max_connections=max_in_flight)) as client:
        async def bounded(i: int) -> Result:
            async with gate:
                return await one(client, urls[i % len(urls)], bodies[i], t_start)

        tasks = []
        for i, gap in enumerate(gaps):
            await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(bounded(i)))
        done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), deadline_s)
    run.results = [d if isinstance(d, Result) else Result(status=-1) for d in done]
    run.wall_s = time.perf_counter() - t_start
    return run
