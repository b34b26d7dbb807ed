"""``ragpic store check [--repair] PATH|URL``, ``ragpic store stats PATH|URL`` and ``ragpic store plan``.

Wired into ``ragpic/cli/main.py`` with :func:`add_parser`; the logic lives in
:mod:`ragpic.cache.tools.check`, :mod:`ragpic.cache.tools.report` and :mod:`ragpic.cache.tools.plan`.
``check`` exits 0 clean (or repaired), 1 problems left, 2 the target is not a store; ``stats`` 0,
or 2 not a store; ``plan`` (:mod:`ragpic.cli.store_plan`) 0, or 2 a bad flag.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from ragpic.cli.store_plan import add_plan_parser


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``store`` (with its ``check`` sub-command) to the ``ragpic`` parser."""
    store = subparsers.add_parser("store", help="inspect a KV store folder or Redis (`ragpic store check --help`)")
    sub = store.add_subparsers(dest="store_command", required=True)
    check = sub.add_parser("check", help="count entries, bytes, corrupt and orphaned files; --repair fixes them",
                           description="Verify every entry of a KV store (checksums, keys) and its catalog.")
    check.add_argument("target", metavar="PATH|URL", help="the folder given as store= (e.g. my_index/kv) "
                                                           "or redis://host:port/db")
    check.add_argument("--repair", action="store_true", help="delete corrupt entries and orphans, rebuild the catalog")
    check.add_argument("--prefix", default="ragpic:", help="Redis key prefix (default: ragpic:)")
    check.add_argument("--json", dest="json_out", action="store_true", help="print the counts as JSON")
    check.set_defaults(func=run)
    stats = sub.add_parser("stats", help="entries, bytes, bytes per token, hits, misses, evictions, recompiles",
                           description="Figures of a KV store and the counts of every process that used it "
                                       "(read-only; cheap at any size).")
    stats.add_argument("target", metavar="PATH|URL", help="the folder given as store= or redis://host:port/db")
    stats.add_argument("--prefix", default="ragpic:", help="Redis key prefix (default: ragpic:)")
    stats.add_argument("--json", dest="json_out", action="store_true", help="print the figures as JSON")
    stats.set_defaults(func=run_stats)
    add_plan_parser(sub)
    return store


def run_stats(args: argparse.Namespace) -> int:
    """Run ``ragpic store stats``; 0, or 2 when the target is not a store."""
    from ragpic.cache.tools.report import format_report, store_report
    from ragpic.errors import ConfigError

    try:
        report = store_report(args.target, prefix=args.prefix)
    except ConfigError as exc:
        print(f"ragpic store stats: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json(), indent=1) if args.json_out else format_report(report))
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``ragpic store check``; return the exit status (see the module docstring)."""
    from ragpic.cache.tools.check import check_store, format_result
    from ragpic.errors import ConfigError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        result = check_store(args.target, repair=args.repair, prefix=args.prefix)
    except ConfigError as exc:
        print(f"ragpic store check: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_json(), indent=1) if args.json_out else format_result(result))
    return 0 if result.clean or result.repaired else 1
