"""Peak memory of loading a GGUF: the first load (a fresh ``RAGPIC_HOME``) and a later one.

Each load runs in its own child process, so its peak RSS (``ru_maxrss``) is that load's alone:
the interpreter, torch, transformers, the conversion and the loaded model. The bound the
loader is held to (docs/ARCHITECTURE.md §4.8) is 1.5x the file plus 1 GB.

    python benchmarks/first_load.py --model ~/.cache/ragpic/models/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \\
        [--weights auto] [--json docs/results/first_load_0.5b.json]

Prints one line per load and, with ``--json``, writes them with the machine's ISA.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = r"""
import json, resource, sys, time
t = time.perf_counter()
from ragpic.core.model import load_model
lm = load_model(sys.argv[1], device="cpu", weights=sys.argv[2])
import torch
ids = lm.tokenizer("a short check that the model runs", return_tensors="pt").input_ids
with torch.no_grad():
    lm.model(ids)
print(json.dumps({"seconds": time.perf_counter() - t, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "weights": str(lm.weights), "summary": lm.weights_summary,
                  "capability": torch.backends.cpu.get_cpu_capability()}))
"""


def load_once(model: str, weights: str, home: Path) -> dict:
    """One load of ``model`` in a child process with ``RAGPIC_HOME=home``: its seconds and peak RSS."""
    env = {**os.environ, "RAGPIC_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", _CHILD, model, weights], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a .gguf file")
    ap.add_argument("--weights", default="auto", help="the weights format to load with (default: auto)")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    size = Path(args.model).expanduser().stat().st_size
    bound = 1.5 * size + 2**30
    rows = []
    with tempfile.TemporaryDirectory(prefix="ragpic-first-load-") as home:
        for load in ("first", "later"):
            started = time.perf_counter()
            row = {"load": load, **load_once(str(Path(args.model).expanduser()), args.weights, Path(home))}
            row["wall"] = time.perf_counter() - started
            row["seconds"] = round(row["seconds"], 1)
            row["peak_rss_gib"] = round(row["peak_rss"] / 2**30, 2)
            row["x_file"] = round(row["peak_rss"] / size, 1)
            rows.append(row)
            print(f"{load:>5} load: peak RSS {row['peak_rss'] / 2**30:.2f} GiB ({row['peak_rss'] / size:.1f}x the file; "
                  f"bound {bound / 2**30:.2f} GiB), {row['seconds']:.1f} s, weights={row['weights']}", flush=True)
    result = {"model": Path(args.model).name, "file_bytes": size, "file_gib": round(size / 2**30, 2),
              "bound_bytes": bound, "bound_gib": round(bound / 2**30, 2), "loads": rows,
              "command": "python benchmarks/first_load.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(r["peak_rss"] <= bound for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
