"""`ragpic compile` in process against `--ray` on this machine: throughput, per-worker rates,
and the store write's share beside the compile (docs/SCALING.md, *Ingest on Ray*).

A corpus of the bundled essays (``--docs`` of them) is compiled with the embedded SmolLM2 into a
fresh ``redis-server`` (started here on a free loopback port, flushed before each run), by the
command a user runs, in three set-ups, interleaved over ``--repeats`` rounds:

- ``process``: one process, ``--threads`` torch threads;
- ``ray 1x2``: a local Ray cluster, one actor with 2 CPUs;
- ``ray 2x1``: a local Ray cluster, two actors with 1 CPU each.

Reported per run (the command's own ``--json`` summary): wall seconds (model loads and Ray's
start included: what a user waits), tokens/s while compiling, each worker's tokens/s, and per
chunk the compile, encode and store-write milliseconds. On a 2-core machine Ray cannot beat
one process: this measures its overhead and shows the write path is not the bottleneck.

    python benchmarks/bench_compile_ray.py --docs 4 --repeats 2 --json docs/results/compile_ray.json
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
from importlib import resources
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def corpus(folder: Path, docs: int) -> Path:
    essays = sorted(resources.files("ragpic").joinpath("data", "haystack").iterdir(), key=lambda p: p.name)
    for p in essays[:docs]:
        (folder / p.name).write_text(p.read_text())
    return folder


def run(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=4, help="bundled essays (4)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk-tokens", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4, help="chunks a batch: small enough that every worker gets work")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ragpic-bench-"))
    port = free_port()
    redis = subprocess.Popen([shutil.which("redis-server"), "--port", str(port), "--save", "", "--appendonly", "no",
                              "--dir", str(tmp)], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    url = f"redis://127.0.0.1:{port}/0"
    (tmp / "docs").mkdir()
    docs = corpus(tmp / "docs", args.docs)
    base = [sys.executable, "-m", "ragpic.cli", "compile", str(docs), "--store", url, "--chunk-tokens",
            str(args.chunk_tokens), "--batch", str(args.batch), "--quiet", "--json"]
    setups = {"process": ["--threads", str(args.threads)],
              "ray 1x2": ["--ray", "--workers", "1", "--cpus-per-worker", "2"],
              "ray 2x1": ["--ray", "--workers", "2", "--cpus-per-worker", "1"]}
    rows: dict[str, list[dict]] = {name: [] for name in setups}
    try:
        for r in range(args.repeats):
            for name, extra in setups.items():
                subprocess.run(["redis-cli", "-p", str(port), "flushall"], capture_output=True, check=True)
                t0 = time.perf_counter()
                rep = run(base + extra)
                rep["outer_wall_s"] = time.perf_counter() - t0
                rows[name].append(rep)
                n = max(rep["compiled"], 1)
                print(f"[{r}] {name}: {rep['compiled']} chunks, {rep['tokens']} tokens, wall {rep['outer_wall_s']:.1f} s, "
                      f"compile {1000 * rep['compile_s'] / n:.0f} ms/chunk, encode {1000 * rep['encode_s'] / n:.1f}, "
                      f"write {1000 * rep['write_s'] / n:.1f}; workers " + ", ".join(
                          f"{w['tokens'] / w['compile_s']:.0f} tok/s" for w in rep["workers"].values() if w["compile_s"]),
                      file=sys.stderr)
    finally:
        redis.kill()
    summary = {}
    for name, reps in rows.items():
        med = lambda f: statistics.median(f(x) for x in reps)
        summary[name] = {
            "chunks": reps[0]["compiled"], "tokens": reps[0]["tokens"],
            "wall_s": med(lambda x: x["outer_wall_s"]),
            "tokens_per_s_wall": med(lambda x: x["tokens"] / x["outer_wall_s"]),
            "compile_ms_per_chunk": med(lambda x: 1000 * x["compile_s"] / x["compiled"]),
            "encode_ms_per_chunk": med(lambda x: 1000 * x["encode_s"] / x["compiled"]),
            "write_ms_per_chunk": med(lambda x: 1000 * x["write_s"] / x["compiled"]),
            "worker_tokens_per_s": [round(w["tokens"] / w["compile_s"]) for w in reps[-1]["workers"].values()
                                    if w["compile_s"]],
        }
    print(f"{'setup':10} {'wall s':>8} {'tok/s (wall)':>13} {'compile ms':>11} {'encode ms':>10} {'write ms':>9}  workers tok/s")
    for name, s in summary.items():
        print(f"{name:10} {s['wall_s']:8.1f} {s['tokens_per_s_wall']:13.0f} {s['compile_ms_per_chunk']:11.0f} "
              f"{s['encode_ms_per_chunk']:10.1f} {s['write_ms_per_chunk']:9.1f}  {s['worker_tokens_per_s']}")
    if args.json:
        import torch

        Path(args.json).write_text(json.dumps({
            "command": " ".join(sys.argv), "cpu": torch.backends.cpu.get_cpu_capability(),
            "threads": args.threads, "docs": args.docs, "batch": args.batch, "summary": summary, "runs": rows}, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
