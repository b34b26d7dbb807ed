"""Where a link's time goes: torch.profiler over the link of one RULER prompt, per method,
beside ``full``'s prefill of the same tokens (docs/RESULTS.md §32).

The link runs as the evaluations run it: the engine's request, the prompt's leading text
from the prefix cache (``full``'s rows, as the engine keeps the last request's), chunks
compiled alone (a ``@prev<m>`` variant links the same rows, so its link costs the same).
Each method links ``--repeats`` times after one warm-up; the table lists the ops that take
the most self CPU time over those runs, and the medians give the speed-up.

    python benchmarks/link_profile.py --model $M --dtype bfloat16 --hold-dense --length 4096 \\
        --methods legolink-16,qr-2-k4-h1-w-s,qr-4-k4-h2-w-s --threads 2
    python benchmarks/link_profile.py --model $M --dtype bfloat16 --hold-dense --length 4096 --no-profile \\
        --methods naive,legolink-4,legolink-16,legolink-32,legolink-64,qr-2-k4-h1-w-s --repeats 5 --after-full \\
        --threads 2 --json docs/results/link_rows_qwen05b_4k.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from ragpic.core.model import load_model
from ragpic.core.ops import attention
from ragpic.engine.offline import request
from ragpic.engine.prefix import PrefixCache
from ragpic.eval.data import default_haystack, load_haystack
from ragpic.eval.ruler_tasks import generate_sample
from ragpic.eval.variants import compile_for, method_of, prompt_segments


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", default=None)
    p.add_argument("--weights", default="auto")
    p.add_argument("--hold-dense", action="store_true")
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--task", default="niah_multivalue")
    p.add_argument("--methods", default="legolink-16,qr-2-k4-h1-w-s,qr-4-k4-h2-w-s")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--no-profile", action="store_true", help="time the links only (no profiler table)")
    p.add_argument("--after-full", action="store_true",
                   help="also time each method's link right after a `full` link, as the evaluations run them "
                        "(`full` first on every prompt), beside its time after its own link")
    p.add_argument("--compare-gqa", action="store_true",
                   help="also time each link, interleaved, with every band's attention run as enable_gqa (the CPU "
                        "path before stop 56; ops/attention.py:fold_pays) and report the ratio and logit difference")
    p.add_argument("--json", dest="json_out", default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model(args.model, dtype=args.dtype, weights=args.weights, hold_dense=args.hold_dense)
    sample = generate_sample(lm.tokenizer, load_haystack(default_haystack()), args.task, args.length, 0, seed=0)
    methods = ["full", *[m for m in args.methods.split(",") if m and m != "full"]]
    kvs = compile_for(lm, [list(c.ids) for c in sample.chunks], methods)["plain"]
    segs = prompt_segments(lm.tokenizer, sample.prefix, kvs, sample.suffix, glue=None)
    prefixes = PrefixCache(lm.fingerprint)

    def link_once(m: str) -> float:
        req = request(lm, segs, method_of(m), 1, prefixes=prefixes).link()
        s = req.linked.seconds
        req.release()
        return s

    def compare_gqa(m: str, repeats: int) -> tuple[list[float], list[float], float]:
        """``m``'s link with every band unfolded (``enable_gqa``) and as planned, interleaved."""
        planned = attention.plan_bands

        def unfolded(bands, mask, *, groups, fold, **kw):
            return planned(bands, mask, groups=groups, fold=False, **kw)

        def run(patch):
            attention.plan_bands = unfolded if patch else planned
            try:
                req = request(lm, segs, method_of(m), 1, prefixes=prefixes).link()
                out = req.linked.seconds, req.first_logits
                req.release()
                return out
            finally:
                attention.plan_bands = planned

        gqa, fold, diff = [], [], 0.0
        for _ in range(repeats):
            (a, la), (b, lb) = run(True), run(False)
            gqa.append(a), fold.append(b)
            diff = max(diff, float((la - lb).abs().max()))
        return gqa, fold, diff

    def rows_of(m: str) -> int:
        return request(lm, segs, method_of(m), 1, prefixes=prefixes).link().linked.recomputed

    out = {"model": lm.name, "dtype": str(lm.dtype), "length": args.length, "task": args.task,
           "cpu": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(), "methods": {}}
    link_once("full")  # warms the weights (hold-dense) and fills the prefix cache with the leading text
    for m in methods:
        link_once(m)
        row = out["methods"][m] = {"rows": rows_of(m)}
        if not args.no_profile:
            times = []
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(args.repeats):
                    times.append(link_once(m))
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top)
            print(f"\n=== {m}: median link {statistics.median(times):.3f} s over {args.repeats} (profiled) ===\n"
                  f"{table}", flush=True)
            row["profiled_s"] = times
            row["top_ops"] = [{"op": e.key, "self_cpu_s": e.self_cpu_time_total / 1e6 / args.repeats,
                               "count": e.count / args.repeats}
                              for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:args.top]]
        row["link_s"] = [link_once(m) for _ in range(args.repeats)]
        row["median_s"] = statistics.median(row["link_s"])
        if args.compare_gqa and m != "full":
            row["gqa_s"], row["fold_s"], row["max_logit_diff"] = compare_gqa(m, args.repeats)
            row["fold_speedup"] = statistics.median(row["gqa_s"]) / statistics.median(row["fold_s"])
        if args.after_full and m != "full":
            after = []
            for _ in range(args.repeats):
                link_once("full")
                after.append(link_once(m))
            row["after_full_s"], row["after_full_median_s"] = after, statistics.median(after)
    full = out["methods"]["full"]["median_s"]
    for m, r in out["methods"].items():
        r["speedup"] = full / r["median_s"]
        after = f"  after full {r['after_full_median_s']:.3f} s" if "after_full_median_s" in r else ""
        if "fold_speedup" in r:
            after += f"  fold/gqa {r['fold_speedup']:.2f}x (logits differ <= {r['max_logit_diff']:.3g})"
        print(f"{m:>24}: {r['rows']:5d} rows  {r['median_s']:.3f} s  {r['speedup']:.1f}x{after}", file=sys.stderr)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
