"""``ragpic compile SOURCE... --store PATH|URL [--ray [ADDRESS]]``: a corpus into a store.

Wired into ``ragpic/cli/main.py`` with :func:`add_parser`; the work is :mod:`ragpic.corpus`.
Exit codes: 0 every chunk of the corpus is in the store; 1 an error, or chunks missing at the
end (the summary says how many); 2 a usage error, before anything loads.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys

from ragpic.cmdline import COMPILE_HEAD_HELP, at_least, check_model, method_name, need_module
from ragpic.config import MAX_COMPILE_BEHIND
from ragpic.core.kv_quant import NAMES as KV_NAMES
from ragpic.core.weights import NAMES as WEIGHT_NAMES
from ragpic.errors import ConfigError, UsageError

HELP = """Compile every chunk of a corpus into a KV store once, before any query.

SOURCE: folders of .txt/.md files, .jsonl files (one {"text", "id"?, "metadata"?} object a line)
or single .txt/.md files. Chunks are cut exactly as `ragpic demo` and the LlamaIndex hooks cut them
(--chunker llamaindex: SentenceSplitter in model tokens, metadata lines included), so an index of
the same folder finds them stored. Content-addressed: a second run compiles nothing, a killed run
compiles only the rest. Ends by checking that every chunk is in the store (exit 1 if not).

  ragpic compile docs/ --store my_index/kv
  ragpic compile docs/ --store my_index/kv --compile-behind 4   # also behind each document's 4 chunks before
  ragpic compile docs/ corpus.jsonl --store redis://127.0.0.1:6379/0 --ray             # a local Ray cluster
  ragpic compile docs/ --store redis-cluster://10.0.0.5:7000 --ray 10.0.0.1:6379 --workers 8
"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("compile", help="compile a corpus's chunk KV into a store (in process or on Ray)",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="folder of .txt/.md files, .jsonl file, or text file")
    p.add_argument("--store", required=True, help="where the KV goes: a folder, redis://host:port/db or "
                                                  "redis-cluster://host:port (what --store / store= of the app names)")
    p.add_argument("--model", default=None, help="HF model folder or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default=None,
                   help="model dtype, as the app that links will load it (part of every key)")
    p.add_argument("--weights", choices=WEIGHT_NAMES, default="auto", help="weight format (part of every key)")
    p.add_argument("--kv-quant", choices=KV_NAMES, default="int8", help="how KV is stored (default int8)")
    p.add_argument("--method", type=method_name, default="auto",
                   help="the link method the app uses: it picks the compile recipe (default auto, as Config's; "
                        "only legolink-0 compiles differently)")
    p.add_argument("--chunker", choices=["llamaindex", "langchain", "none"], default="llamaindex",
                   help="how documents become chunks (default llamaindex; none: one chunk per document)")
    p.add_argument("--chunk-tokens", type=at_least(16), default=512, help="chunk size in model tokens (default "
                                                                          "512, as ragpic demo)")
    p.add_argument("--batch", type=at_least(1), default=32, help="chunks a worker compiles and writes at a time")
    p.add_argument("--threads", type=at_least(1), default=None, help="torch CPU threads (in process)")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run on a Ray cluster: ADDRESS (host:port, ray://...) or none for a local one")
    p.add_argument("--workers", type=at_least(1), default=1, help="Ray actors, one model each (default 1)")
    p.add_argument("--cpus-per-worker", type=at_least(1), default=1, help="CPUs (torch threads) per Ray actor")
    p.add_argument("--compile-behind", type=at_least(0), default=0, metavar="M",
                   help="also compile each chunk behind the M chunks before it in its document (at most "
                        f"{MAX_COMPILE_BEHIND}; in process, not with --ray): a query engine or server with the same "
                        "compile_behind links them where a prompt holds the chunks in that order")
    p.add_argument("--compile-head", default=None, metavar="TEXT",
                   help=COMPILE_HEAD_HELP)
    p.add_argument("--json", dest="json_out", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run, check=check)
    return p


def _job(args: argparse.Namespace):
    from ragpic.corpus import CompileJob

    try:
        return CompileJob(store=args.store, model=args.model, dtype=args.dtype, weights=args.weights,
                          kv_quant=args.kv_quant, method=args.method, chunker=args.chunker,
                          chunk_tokens=args.chunk_tokens, batch_chunks=args.batch, threads=args.threads or 0,
                          compile_behind=args.compile_behind, compile_head=args.compile_head)
    except ConfigError as e:
        raise UsageError(str(e)) from None


def check(args: argparse.Namespace) -> None:
    """Everything checkable before a model loads: sources, store, model file, Ray installed."""
    from ragpic.cache.backends.spec import parse_store
    from ragpic.corpus.sources import read_source

    check_model(args.model)
    for source in args.sources:
        next(iter(read_source(source)), None)  # exists, right kind, first document readable
    try:
        kind = parse_store(args.store).kind
    except ConfigError as e:
        raise UsageError(f"--store: {e}") from None
    if kind == "memory":
        raise UsageError(f"--store {args.store!r}: a memory store ends with the run; pass a folder or a redis:// URL")
    if args.ray is not None:
        if args.compile_behind:
            raise UsageError("--compile-behind runs in process: a Ray batch may split a document's chunks; "
                             "drop --ray (or run a second, in-process pass with --compile-behind)")
        need_module("ray", "--ray", "ray")
    _job(args)


def run(args: argparse.Namespace) -> int:
    from ragpic.corpus import read_sources
    from ragpic.corpus.local import compile_in_process

    job = _job(args)
    progress = not args.quiet
    # stdout carries the summary (--json: nothing else); libraries that print (LlamaIndex's
    # splitter warns with print) go to stderr
    with contextlib.redirect_stdout(sys.stderr):
        if args.ray is not None:
            from ragpic.corpus.on_ray import compile_on_ray

            logging.getLogger("ray.data").setLevel(logging.WARNING)  # its plan and stats lines; ours is the bar
            report = compile_on_ray(job, args.sources, address=args.ray or None, workers=args.workers,
                                    cpus_per_worker=args.cpus_per_worker, progress=progress)
        else:
            if args.threads:
                import torch

                torch.set_num_threads(args.threads)
            report = compile_in_process(job, read_sources(args.sources), progress=progress)
    if args.json_out:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print("\n".join(report.lines()))
    return 0 if report.ok else 1
