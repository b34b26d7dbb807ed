"""``ragpic serve`` against llama.cpp's ``llama-server`` under a RAG load: one sitting, one GGUF, one server at a time.

    python benchmarks/serve_vs_llamacpp.py [--model 0.5b] [--clients 1,2,4,8] [--per-client 2]
        [--setups ragpic,ragpic-legolink-16,llama-server-reuse,llama-server] [--answers 6]
        [--rates 0.05,0.2,0.8] [--open-requests 10] [--json out.json] [--plot out.png]
    python benchmarks/serve_vs_llamacpp.py --tiny --json out.json   # seconds: the embedded SmolLM2, 1-2 clients

The workload (docs/SERVING.md *Beside llama-server*): the bundled haystack essays and MuSiQue
passages cut into ~250-word chunks (~330 tokens; >= 150 of them), each request a system prompt
plus 6-8 chunks drawn by Zipf(1.0) popularity plus a question (~2.5k tokens), a 64-token greedy
answer streamed through the ``openai`` client; the same requests, in the same order, for every
server. Closed loop: ``c`` clients each send their next request when the last one ends, for each
``c`` of ``--clients``; ``--per-client`` requests per client (at least ``--min-requests``).

Set-ups, started one after the other on loopback ports with ``--threads`` threads each, never together:

- ``ragpic``: ``ragpic serve`` with its defaults (``auto``) on a folder store, the corpus compiled
  ahead through ``POST /v1/context_cache`` (its time is printed, not counted);
- ``ragpic-<method>``: the same server, each request naming ``method`` (e.g. ``legolink-16``);
- ``llama-server-reuse`` / ``llama-server``: ``llama-server -np <clients> -c <clients x 4096>``, with
  and without ``--cache-reuse 256`` (KV shifting of reused chunks: ``naive``'s link), built by
  ``TARGET=llama-server benchmarks/llamacpp_build.sh`` (or ``RAGPIC_LLAMA_SERVER``); skipped with a
  note when it is not built.

Open loop (``--open-setups``): one server per set-up (llama-server with ``-np`` the most
clients), ``--open-requests`` requests at each of ``--rates`` requests/s, Poisson and seeded (the
same schedule for every server), each sent at its time whatever still runs; its requests/s
(answers over the seconds from the first arrival to the last answer) at a rate past a server's
saturation is that server's saturation throughput.

Per set-up and load: TTFT p50/p95/p99, whole-answer p50/p95, output tok/s, requests/s, errors.
``--answers n``: the first ``n`` requests' greedy answers of every set-up at one client (and of
``ragpic`` with ``full``), so the JSON says what share of ragpic's answers equal llama-server's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = "You are a helpful assistant. Answer the question from the passages; say so if they do not hold the answer."
QUESTIONS = ["What is the main argument of these passages?", "Which people or places do the passages name, and why?",
             "What advice do the passages give?", "Summarize the second passage in two sentences.",
             "Which example does the author use, and what does it show?", "What do the passages disagree about?"]


def corpus(words: int, limit: int) -> list[str]:
    """~``words``-word chunks: the haystack essays, then the MuSiQue passages joined in order."""
    out: list[str] = []
    for path in sorted((ROOT / "ragpic/data/haystack").glob("*.txt")):
        w = path.read_text().split()
        out += [" ".join(w[i:i + words]) for i in range(0, len(w) - words + 1, words)]
    w = [t for ex in json.loads((ROOT / "ragpic/data/musique_sample.json").read_text()) for c in ex["ctxs"]
         for t in f"{c['title']}: {c['text']}".split()]
    out += [" ".join(w[i:i + words]) for i in range(0, len(w) - words + 1, words)]
    return out[:limit]


def workload(chunks: list[str], n: int, seed: int, lo: int, hi: int) -> list[list[dict]]:
    """``n`` chat requests: system prompt, then ``lo..hi`` distinct chunks by Zipf(1.0) popularity
    (a seeded shuffle of the corpus sets the ranks) and a question."""
    rng = random.Random(seed)
    rank = list(range(len(chunks)))
    rng.shuffle(rank)
    weights = [1 / (i + 1) for i in range(len(chunks))]
    out = []
    for _ in range(n):
        k, picked = rng.randint(lo, hi), []
        while len(picked) < k:
            i = rank[rng.choices(range(len(chunks)), weights)[0]]
            if i not in picked:
                picked.append(i)
        user = "Passages:\n\n" + "\n\n".join(chunks[i] for i in picked) + f"\n\nQuestion: {rng.choice(QUESTIONS)}"
        out.append([{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}])
    return out


@dataclass
class Result:
    index: int
    ok: bool = False
    ttft_s: float | None = None
    answer_s: float | None = None
    tokens: int = 0
    text: str = ""
    error: str = ""


async def one(client, model: str, index: int, messages: list[dict], max_tokens: int, method: str | None) -> Result:
    res = Result(index)
    t0 = time.perf_counter()
    try:
        stream = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"method": method} if method else None)
        parts, events = [], 0
        async for ev in stream:
            if ev.choices and ev.choices[0].delta and ev.choices[0].delta.content:
                if res.ttft_s is None:
                    res.ttft_s = time.perf_counter() - t0
                parts.append(ev.choices[0].delta.content)
                events += 1
            if ev.usage:
                res.tokens = ev.usage.completion_tokens
        res.answer_s = time.perf_counter() - t0
        res.text, res.tokens, res.ok = "".join(parts), res.tokens or events, True
    except Exception as exc:  # a failed request is counted, with the server's words
        res.error = f"{type(exc).__name__}: {str(exc)[:200]}"
    return res


def openai_client(url: str, connections: int, timeout: float):
    """An ``openai`` client for ``url`` with room for ``connections`` streams at once, no retries."""
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=url + "/v1", api_key="none", timeout=timeout, max_retries=0,
                       http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=connections + 2),
                                                     timeout=timeout))


async def closed_loop(url: str, model: str, requests: list[list[dict]], clients: int, max_tokens: int,
                      method: str | None, timeout: float) -> tuple[list[Result], float]:
    """``clients`` workers taking the next request as their last one ends; results in request order."""
    client = openai_client(url, clients, timeout)
    queue = list(enumerate(requests))
    out: list[Result] = []

    async def worker() -> None:
        while queue:
            i, msgs = queue.pop(0)
            out.append(await one(client, model, i, msgs, max_tokens, method))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    wall = time.perf_counter() - t0
    await client.close()
    return sorted(out, key=lambda r: r.index), wall


async def open_loop(url: str, model: str, requests: list[list[dict]], rate: float, max_tokens: int,
                    method: str | None, timeout: float, seed: int) -> tuple[list[Result], float]:
    """Poisson arrivals at ``rate`` requests/s (seeded: the same schedule for every server), each
    request sent at its time whatever is still running; results in request order, and the
    seconds from the first arrival to the last answer."""
    client = openai_client(url, len(requests), timeout)
    rng = random.Random(seed)
    t0 = time.perf_counter()
    tasks = []
    for i, msgs in enumerate(requests):
        if i:
            await asyncio.sleep(rng.expovariate(rate))
        tasks.append(asyncio.create_task(one(client, model, i, msgs, max_tokens, method)))
    out = await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    await client.close()
    return list(out), wall


def pct(xs: list[float], p: float) -> float | None:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))], 3) if xs else None


def summary(setup: str, clients: int, results: list[Result], wall: float) -> dict:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    ans = [r.answer_s for r in ok]
    return {"setup": setup, "clients": clients, "requests": len(results), "errors": len(results) - len(ok),
            "wall_s": round(wall, 2), "req_per_s": round(len(ok) / wall, 4), "out_tok_per_s": round(sum(r.tokens for r in ok) / wall, 2),
            "ttft_p50_s": pct(ttft, 50), "ttft_p95_s": pct(ttft, 95), "ttft_p99_s": pct(ttft, 99),
            "answer_p50_s": pct(ans, 50), "answer_p95_s": pct(ans, 95),
            "tokens_mean": round(statistics.fmean(r.tokens for r in ok), 1) if ok else 0,
            "first_error": next((r.error for r in results if not r.ok), "")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A server process on a loopback port, its output in a log file, stopped on exit."""

    def __init__(self, argv: list[str], env: dict, log: Path, port: int):
        self.url, self.log_path = f"http://127.0.0.1:{port}", log
        self.log = open(log, "w")
        self.p = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.p.poll() is not None:
                break
            time.sleep(0.5)
        raise RuntimeError(f"{self.url} did not start: {self.log_path.read_text()[-2000:]}")

    def model(self) -> str:
        return httpx.get(self.url + "/v1/models", timeout=10).json()["data"][0]["id"]

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
        self.log.close()


def start_ragpic(model: str | None, threads: int, tmp: Path) -> Server:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "ragpic.cli", "serve", "--port", str(port), "--store", str(tmp / "kv"),
            "--max-queue", "256"] + (["--model", model] if model else [])
    s = Server(argv, env, tmp / f"ragpic-{port}.log", port)
    s.wait_ready()
    return s


def compile_corpus(s: Server, chunks: list[str], per_call: int = 48) -> float:
    """Compile the corpus ahead through ``/v1/context_cache`` (``per_call`` chunks a request, under
    the server's ``--max-compile-tokens``); seconds taken."""
    t0 = time.perf_counter()
    for i in range(0, len(chunks), per_call):
        r = httpx.post(s.url + "/v1/context_cache", json={"texts": chunks[i:i + per_call]}, timeout=3600)
        r.raise_for_status()
        print(f"  compiled {min(i + per_call, len(chunks))}/{len(chunks)} chunks "
              f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    return time.perf_counter() - t0


def llama_server_binary() -> str | None:
    env = os.environ.get("RAGPIC_LLAMA_SERVER")
    if env:
        return env
    path = Path(os.environ.get("RAGPIC_CACHE_DIR", Path.home() / ".cache/ragpic")) / "llama.cpp/llama-server"
    return str(path) if path.exists() else None


def start_llama(binary: str, gguf: str, clients: int, threads: int, reuse: bool, tmp: Path) -> Server:
    port = free_port()
    argv = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads), "-tb", str(threads),
            "-np", str(clients), "-c", str(4096 * clients), "--no-webui"] + (["--cache-reuse", "256"] if reuse else [])
    s = Server(argv, dict(os.environ), tmp / f"llama-{port}.log", port)
    s.wait_ready()
    return s


def fmt(r: dict) -> str:
    return (f"| {r['setup']:<20} | {r['clients']:>2} | {r['requests'] - r['errors']:>3}/{r['requests']:<3} | "
            f"{r['ttft_p50_s']!s:>6} | {r['ttft_p95_s']!s:>6} | {r['ttft_p99_s']!s:>6} | {r['answer_p50_s']!s:>6} | "
            f"{r['answer_p95_s']!s:>6} | {r['out_tok_per_s']:>6} | {r['req_per_s']:>6} |")


HEAD = ("| set-up | clients | ok | TTFT p50 | p95 | p99 | answer p50 | p95 | out tok/s | req/s |\n"
        "|---|---|---|---|---|---|---|---|---|---|")


def resolve_model(name: str | None) -> tuple[str | None, str | None]:
    """``(ragpic serve's --model, the GGUF llama-server loads)``: ``0.5b`` / ``1.5b``, the GGUF
    ``ragpic model get`` installed; a path as it is; ``embedded``: ragpic's default (SmolLM2's GGUF)."""
    if name in (None, "", "embedded"):
        from ragpic.paths import default_gguf

        gguf = default_gguf()
        return None, str(gguf) if gguf else None
    if Path(name).exists():
        return name, name
    from ragpic.models.assemble import gguf_path
    from ragpic.models.registry import pinned_model

    path = gguf_path(pinned_model(f"qwen2.5-coder-{name}"))
    if not path.exists():
        raise SystemExit(f"{path} is not there: run `scripts/run.sh model get qwen2.5-coder-{name}` first")
    return str(path), str(path)


def run(args) -> dict:
    model_arg, gguf = resolve_model(args.model)
    chunks = corpus(args.words, args.corpus)
    biggest = max(args.clients, default=8)  # --clients '': the open loop alone
    n_req = max(args.min_requests, args.per_client * biggest)
    requests = workload(chunks, n_req, args.seed, args.lo, args.hi)
    tmp = Path(tempfile.mkdtemp(prefix="ragpic-serve-vs-llamacpp-"))
    rows: list[dict] = []
    open_rows: list[dict] = []
    answers: dict[str, list[str]] = {}
    notes: list[str] = []
    out = {"rows": rows, "open_rows": open_rows, "answers": answers, "notes": notes, "corpus_chunks": len(chunks), "requests": n_req,
           "args": vars(args), "model": gguf, "cpu": cpu_line()}
    try:
        ragpic_setups = [s for s in args.setups if s.startswith("ragpic")]
        if ragpic_setups:
            s = start_ragpic(model_arg, args.threads, tmp)
            try:
                out["compile_s"] = round(compile_corpus(s, chunks), 1)
                model = s.model()
                for setup in ragpic_setups:
                    method = setup[len("ragpic-"):] if setup != "ragpic" else None
                    load(rows, answers, setup, s.url, model, requests, args, method, chunks)
                    if setup in args.open_setups:
                        open_load(open_rows, setup, s.url, model, args, method, chunks)
                if args.answers:
                    res, _ = asyncio.run(closed_loop(s.url, model, requests[:args.answers], 1, args.max_tokens,
                                                     "full", args.timeout))
                    answers["ragpic-full"] = [r.text for r in res]
            finally:
                s.stop()
        binary = llama_server_binary()
        for setup in [s for s in args.setups if s.startswith("llama-server")]:
            if binary is None or gguf is None:
                notes.append(f"{setup} skipped: " + ("no GGUF model (--model)" if gguf is None else
                             "llama-server is not built (TARGET=llama-server benchmarks/llamacpp_build.sh)"))
                print(notes[-1], file=sys.stderr)
                continue
            for clients in args.clients:  # -np follows the clients, so one server per load
                s = start_llama(binary, gguf, clients, args.threads, setup.endswith("-reuse"), tmp)
                try:
                    load(rows, answers, setup, s.url, s.model(), requests, args, None, chunks, only=[clients])
                finally:
                    s.stop()
            if setup in args.open_setups:  # open loop: as many slots as the most clients
                s = start_llama(binary, gguf, biggest, args.threads, setup.endswith("-reuse"), tmp)
                try:
                    open_load(open_rows, setup, s.url, s.model(), args, None, chunks)
                finally:
                    s.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["same_answers"] = same_answers(answers)
    return out


def warm_up(url, model, args, method, chunks) -> None:
    """One request of another seed, not counted: lazy initialisation out of the figures, and no
    measured prompt in the server's caches."""
    warm = workload(chunks, 1, args.seed + 7919, args.lo, args.hi)
    asyncio.run(closed_loop(url, model, warm, 1, args.max_tokens, method, args.timeout))


def load(rows, answers, setup, url, model, requests, args, method, chunks, only=None) -> None:
    warm_up(url, model, args, method, chunks)
    for clients in only or args.clients:
        n = max(args.min_requests, args.per_client * clients)
        res, wall = asyncio.run(closed_loop(url, model, requests[:n], clients, args.max_tokens, method, args.timeout))
        rows.append(summary(setup, clients, res, wall))
        print(fmt(rows[-1]), flush=True)
        if clients == 1 and args.answers:
            answers[setup] = [r.text for r in res[:args.answers]]


def open_load(open_rows, setup, url, model, args, method, chunks) -> None:
    """One warm-up request, then ``--open-requests`` requests at each of ``--rates`` (open loop).
    Each rate sends requests of its own (seeded: the same ones for every server): one server
    serves every rate, and a prompt it has seen whole would be a prompt-cache hit."""
    warm_up(url, model, args, method, chunks)
    for i, rate in enumerate(args.rates):
        requests = workload(chunks, args.open_requests, args.seed + 1 + i, args.lo, args.hi)
        res, wall = asyncio.run(open_loop(url, model, requests, rate, args.max_tokens, method,
                                          args.timeout, args.seed))
        open_rows.append({**summary(setup, 0, res, wall), "offered_per_s": rate})
        print(fmt(open_rows[-1]).replace("|  0 |", f"| {rate}/s |", 1), flush=True)


def same_answers(answers: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """Per ragpic set-up and llama-server set-up, prompt by prompt over their greedy answers: the
    share that are equal (``same``) and the mean share of words the two answers start with in
    common (``prefix``: where two numerically different engines part ways)."""
    out = {}
    for a, xs in answers.items():
        for b, ys in answers.items():
            if a.startswith("ragpic") and b.startswith("llama-server") and xs and ys:
                pairs = list(zip(xs, ys))
                prefix = []
                for x, y in pairs:
                    wx, wy = x.split(), y.split()
                    n = next((i for i, (u, v) in enumerate(zip(wx, wy)) if u != v), min(len(wx), len(wy)))
                    prefix.append(n / max(1, len(wx), len(wy)))
                out[f"{a} = {b}"] = {"same": round(sum(x.strip() == y.strip() for x, y in pairs) / len(pairs), 3),
                                     "prefix": round(sum(prefix) / len(prefix), 3)}
    return out


def cpu_line() -> str:
    try:
        import torch

        cap = torch.backends.cpu.get_cpu_capability()
    except Exception:
        cap = "?"
    name = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")), "?") if Path("/proc/cpuinfo").exists() else "?"
    return f"{name}, {os.cpu_count()} cores, torch capability {cap}"


def plot(out: dict, path: str) -> None:
    """Latency against load, one line per set-up: p95 TTFT and p95 whole answer by clients."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    opened = bool(out.get("open_rows"))
    fig, grid = plt.subplots(1 + opened, 2, figsize=(10, 4 + 3.6 * opened), squeeze=False)
    answer = f"whole answer (up to {out['args']['max_tokens']} tokens), p95"
    panels = [(grid[0], out["rows"], "clients", "concurrent clients (closed loop)")]
    if opened:
        panels.append((grid[1], out["open_rows"], "offered_per_s", "offered requests/s (open loop, Poisson)"))
    setups = list(dict.fromkeys(r["setup"] for r in out["rows"] + out.get("open_rows", [])))
    for axes, rows_all, x, xlabel in panels:
        for setup in dict.fromkeys(r["setup"] for r in rows_all):
            rows = [r for r in rows_all if r["setup"] == setup]
            for ax, key in zip(axes, ("ttft_p95_s", "answer_p95_s")):  # one colour per set-up in every panel
                ax.plot([r[x] for r in rows], [r[key] for r in rows], marker="o", color=f"C{setups.index(setup)}",
                        label=setup if setup != "ragpic" else "ragpic (default)")
        ticks = sorted({r[x] for r in rows_all})
        for ax, title in zip(axes, ("time to first token, p95", answer)):
            ax.set(xlabel=xlabel, ylabel="seconds", title=title, xscale="log", yscale="log")
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
            ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.grid(alpha=0.3, which="both")
        axes[0].legend(fontsize=8)
    fig.suptitle(f"RAG traffic, {Path(out['model'] or 'model').name}, {out['args']['threads']} threads per server", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="0.5b", help="0.5b, 1.5b (from `ragpic model get`), a .gguf path, or embedded")
    ap.add_argument("--setups", type=lambda s: s.split(","),
                    default=["ragpic", "ragpic-legolink-16", "llama-server-reuse", "llama-server"])
    ap.add_argument("--clients", type=ints, default=[1, 2, 4, 8])
    ap.add_argument("--per-client", type=int, default=2, help="requests per client at each load")
    ap.add_argument("--min-requests", type=int, default=6, help="requests at each load, at least")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="threads per server")
    ap.add_argument("--corpus", type=int, default=160, help="chunks in the corpus")
    ap.add_argument("--words", type=int, default=250, help="words per chunk (~330 Qwen2.5 tokens)")
    ap.add_argument("--lo", type=int, default=6, help="fewest chunks per request")
    ap.add_argument("--hi", type=int, default=8, help="most chunks per request")
    ap.add_argument("--answers", type=int, default=6, help="greedy answers compared across set-ups (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    ap.add_argument("--tiny", action="store_true",
                    help="seconds-long: the embedded SmolLM2, 1-2 clients, llama-server beside it where it is built")
    ap.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[0.05, 0.2, 0.8],
                    help="open-loop Poisson arrival rates (requests/s); the highest should be past every server's saturation")
    ap.add_argument("--open-requests", type=int, default=10, help="requests at each open-loop rate")
    ap.add_argument("--open-setups", type=lambda s: [x for x in s.split(",") if x],
                    default=["ragpic", "llama-server-reuse", "llama-server"], help="set-ups run open loop too ('' for none)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None, help="a PNG of latency against load (docs/img/serve_vs_llamacpp.png)")
    args = ap.parse_args(argv)
    if args.tiny:
        args.model, args.setups = "embedded", ["ragpic", "llama-server-reuse"]
        args.clients, args.per_client, args.min_requests = [1, 2], 2, 2
        args.max_tokens, args.corpus, args.words, args.lo, args.hi, args.answers = 8, 12, 120, 2, 3, 2
        args.rates, args.open_requests, args.open_setups = [4.0], 3, ["ragpic"]
    print(HEAD, flush=True)
    out = run(args)
    if out["same_answers"]:
        print("greedy answers, equal / words in common from the start: " + ", ".join(
            f"{k}: {v['same']:.0%} / {v['prefix']:.0%}" for k, v in out["same_answers"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    if args.plot:
        plot(out, args.plot)
    return 1 if any(r["errors"] for r in out["rows"] + out["open_rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
