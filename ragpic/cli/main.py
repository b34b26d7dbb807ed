"""``ragpic demo | compile | eval | eval needle | eval ruler | bench | calibrate | store | serve | model`` — the command line.

Each command registers its parser with ``set_defaults(func=..., check=...)``: ``check`` runs
first and validates every argument without loading a model; ``func`` does the work. Adding a
command is one import and one ``add_..._parser(sub)`` line in :func:`build_parser`.

Exit codes (:func:`ragpic.cmdline.run_command`): 0 done; 2 a usage error (one line naming the
argument and what to pass); 1 an error while running (one line; ``RAGPIC_DEBUG=1`` shows the
traceback); 130 interrupted.
Heavy imports (torch, transformers) happen inside the commands, so ``ragpic --help`` is quick.
"""

from __future__ import annotations

import argparse
import sys

from ragpic.cli.calibrate import add_parser as add_calibrate_parser
from ragpic.cli.compile import add_parser as add_compile_parser
from ragpic.cli.eval import add_bench_parser, add_eval_parser, build_needle_parser
from ragpic.cli.ruler import build_ruler_parser
from ragpic.cmdline import Parser, run_command
from ragpic.demo.options import add_demo_parser
from ragpic.cli.model import add_parser as add_model_parser
from ragpic.cli.serve import add_parser as add_serve_parser
from ragpic.cli.store import add_parser as add_store_parser

DESCRIPTION = """Position-independent KV caching (EPIC / LegoLink) for RAG on your own models.

Commands:
  demo          a LlamaIndex RAG app over a folder: linked KV vs full prefill, side by side
  compile       compile a corpus's chunk KV into a store once (in process or on a Ray cluster)
  eval          QA accuracy and fidelity to full of every link method (bundled MuSiQue questions)
  eval needle   needle in a haystack (bundled Paul Graham essays)
  eval ruler    RULER-style synthetic tasks: needles, variable tracking across chunks, common words
  bench         link TTFT of every method vs context length
  calibrate     each link recipe's share of full and speed-up on a model, for method="auto"
  store check   entries, bytes, corrupt and orphaned files of a KV store (--repair fixes them)
  store stats   entries, bytes per token, hits, misses, evictions and recompiles of a KV store
  store plan    capacity on paper: bytes per token per KV format, chunks per memory, hot-set hit rates
  serve         an OpenAI-compatible server (continuous batching, context-cache API, shared Redis)
  model get     install and verify a pinned larger model (Qwen2.5-Coder 0.5B/1.5B GGUF); `model list`

`ragpic COMMAND --help` describes each. Everything runs offline on the embedded model."""


def build_parser() -> argparse.ArgumentParser:
    """The ``ragpic`` parser with every subcommand (``eval needle`` and ``eval ruler`` have their own,
    see :func:`parse`)."""
    parser = Parser(prog="ragpic", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_demo_parser(sub)
    add_compile_parser(sub)
    add_eval_parser(sub)
    add_bench_parser(sub)
    add_calibrate_parser(sub)
    add_store_parser(sub)
    add_serve_parser(sub)
    add_model_parser(sub)
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse and check ``argv`` (raises :class:`ragpic.errors.UsageError`); nothing is loaded yet."""
    if argv[:2] in (["eval", "needle"], ["eval", "ruler"]):
        build = build_needle_parser if argv[1] == "needle" else build_ruler_parser
        args = build().parse_args(argv[2:])
    else:
        args = build_parser().parse_args(argv)
    args.argv = list(argv)  # the command line as given: what a calibration file says made it
    check = getattr(args, "check", None)
    if check is not None:
        check(args)
    return args


def _prog(argv: list[str]) -> str:
    """``ragpic demo``, ``ragpic eval needle``...: the command a message belongs to."""
    words = argv[:2] if argv[:2] in (["eval", "needle"], ["eval", "ruler"]) else argv[:1]
    return " ".join(["ragpic", *(w for w in words if not w.startswith("-"))])


def main(argv: list[str] | None = None) -> int:
    """Run ``ragpic`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    return run_command(list(sys.argv[1:] if argv is None else argv), parse, _prog)


if __name__ == "__main__":
    sys.exit(main())
