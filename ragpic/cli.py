"""``ragpic demo | eval | eval needle | bench`` — the command line.

Heavy imports (torch, transformers) happen inside the commands, so ``ragpic --help`` is quick.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path


def _csv(kind=str):
    def parse(text: str):
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        try:
            return [kind(t) for t in items]
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from e
    return parse


def _default_haystack() -> str | None:
    for cand in (os.environ.get("RAGPIC_HAYSTACK"), "../shared/data/haystack",
                 str(Path(__file__).resolve().parents[2] / "shared" / "data" / "haystack")):
        if cand and Path(cand).is_dir():
            return cand
    return None


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model folder or cached hub id (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda:0 ...")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT", help="write the full results as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ragpic", description="Position-independent KV caching (EPIC / LegoLink).")
    sub = parser.add_subparsers(dest="command", required=True)

    from .demo import add_arguments as add_demo_arguments  # stdlib-only module: cheap

    demo = sub.add_parser("demo", help="answer questions over a folder of documents with linked KV")
    add_demo_arguments(demo)

    ev = sub.add_parser("eval", help="accuracy and fidelity to full of every link method on QA data "
                                     "(`ragpic eval needle --help` for the needle test)")
    ev.add_argument("--dataset", required=True, help='JSON list of {"question", "answers", "ctxs": [{"title", "text"}]}')
    ev.add_argument("--limit", type=int, default=None, help="first N questions")
    ev.add_argument("--methods", type=_csv(), default=None,
                    help="comma list (default: full,naive,legolink-0,legolink-1,legolink-16,cacheblend-15)")
    ev.add_argument("--chunking", default="passage", help="passage (one chunk per passage) or tokens:N")
    ev.add_argument("--passage-tokens", type=int, default=None, help="cut each passage to its first N tokens")
    ev.add_argument("--max-new-tokens", type=int, default=32)
    ev.add_argument("--plot", default=None, metavar="OUT.png", help="bar chart of teacher-forced KL / top-1 with CIs")
    _add_model_args(ev)

    bench = sub.add_parser("bench", help="link TTFT of every method vs context length")
    bench.add_argument("--context-tokens", type=_csv(int), default=[1024, 2048, 4096, 8192])
    bench.add_argument("--chunk-tokens", type=int, default=512)
    bench.add_argument("--k", type=int, default=16, help="K of the default list's legolink-K")
    bench.add_argument("--query-tokens", type=int, default=32)
    bench.add_argument("--repeats", type=int, default=5)
    bench.add_argument("--methods", type=_csv(), default=None,
                       help="comma list (default: full,naive,legolink-0,legolink-<k>,cacheblend-15)")
    bench.add_argument("--haystack", default=None, help="folder of .txt files (default: ../shared/data/haystack)")
    bench.add_argument("--no-memory", action="store_true", help="skip the profiled peak-memory pass")
    bench.add_argument("--plot", default=None, metavar="OUT.png")
    _add_model_args(bench)
    return parser


def build_needle_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ragpic eval needle",
                                description="Needle in a haystack (EPIC's setup), scored by F1 vs the needle.")
    p.add_argument("--haystack", default=None, help="folder of .txt essays (default: ../shared/data/haystack)")
    p.add_argument("--lengths", type=_csv(int), default=[1024, 2048, 4096])
    p.add_argument("--depths", type=_csv(float), default=[0, 0.25, 0.5, 0.75, 1.0])
    p.add_argument("--methods", type=_csv(), default=None,
                   help="comma list (default: full,naive,legolink-0,legolink-1,legolink-16,cacheblend-15)")
    p.add_argument("--chunk-tokens", type=int, default=512)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--plot", default=None, metavar="OUT.png", help="heat maps (one panel per method + one file each)")
    _add_model_args(p)
    return p


def _clean(obj):
    """JSON-safe: NaN/inf -> null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _write_json(path: str | None, data: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(_clean(data), indent=1))
        print(f"wrote {path}", file=sys.stderr)


def _progress(args):
    return None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))


def _load(args):
    import torch

    from ragpic.core.model import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    return load_model(args.model, device=args.device)


def _need_haystack(args) -> str:
    hay = args.haystack or _default_haystack()
    if not hay:
        raise SystemExit("ragpic: no haystack folder: pass --haystack DIR (a folder of .txt files)")
    return hay


def cmd_eval(args) -> int:
    from .eval.data import load_qa, parse_chunking
    from .eval.evaluate import evaluate_qa, format_table, plot_eval

    chunk_tokens = parse_chunking(args.chunking)
    examples = load_qa(args.dataset, args.limit)
    lm = _load(args)
    report = evaluate_qa(lm, examples, args.methods, chunk_tokens=chunk_tokens, passage_tokens=args.passage_tokens,
                         max_new_tokens=args.max_new_tokens, progress=_progress(args))
    print(format_table(report.methods))
    _write_json(args.json_out, report.to_json())
    if args.plot:
        print(f"wrote {plot_eval(report.to_json(), args.plot)}", file=sys.stderr)
    return 0


def cmd_needle(args) -> int:
    from .eval.needle import format_table, plot_heatmaps, run_needle

    lm = _load(args)
    result = run_needle(lm, _need_haystack(args), lengths=args.lengths, depths=args.depths, methods=args.methods,
                        chunk_tokens=args.chunk_tokens, max_new_tokens=args.max_new_tokens, progress=_progress(args))
    print(format_table(result))
    _write_json(args.json_out, result)
    if args.plot:
        for p in plot_heatmaps(result, args.plot):
            print(f"wrote {p}", file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    from .eval.bench import format_table, plot_bench, run_bench

    lm = _load(args)
    result = run_bench(lm, haystack_dir=_need_haystack(args), context_tokens=args.context_tokens,
                       chunk_tokens=args.chunk_tokens, k=args.k, query_tokens=args.query_tokens,
                       repeats=args.repeats, methods=args.methods, measure_memory=not args.no_memory,
                       progress=_progress(args))
    print(format_table(result))
    _write_json(args.json_out, result)
    if args.plot:
        print(f"wrote {plot_bench(result, args.plot)}", file=sys.stderr)
    return 0


def cmd_demo(args) -> int:
    from .demo import main as demo_main

    return demo_main(args) or 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["eval", "needle"]:
        return cmd_needle(build_needle_parser().parse_args(argv[2:]))
    args = build_parser().parse_args(argv)
    return {"demo": cmd_demo, "eval": cmd_eval, "bench": cmd_bench}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
