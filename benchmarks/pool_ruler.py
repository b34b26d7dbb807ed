"""Pool ``ragpic eval ruler`` JSONs into one table: a bar measured in parts (docs/RESULTS.md §29).

A bar such as "every RULER task at 8 samples" is often run in parts: the tasks that separate
methods first, the others later, or several seeds. This reads the parts' ``--json`` files,
keeps the methods every part ran (or ``--methods``), and prints ``ragpic eval ruler``'s table
over all their samples (:func:`ragpic.eval.ruler.pool_results`). Speed-ups stay per sample
against ``full`` in its own run; pool only runs from one machine and settings.

    python benchmarks/pool_ruler.py A.json B.json [--methods full,qr-4-k4-h1-w-s] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ragpic.errors import ConfigError
from ragpic.eval.ruler import format_table, pool_results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("parts", nargs="+", type=Path, help="JSON files written by ragpic eval ruler --json")
    p.add_argument("--methods", default=None, help="comma list to keep (default: every method all parts ran)")
    p.add_argument("--json", type=Path, default=None, help="write the pooled result here")
    args = p.parse_args()
    missing = [str(f) for f in args.parts if not f.is_file()]
    if missing:
        p.error(f"no such file: {', '.join(missing)}")
    try:
        pooled = pool_results([json.loads(f.read_text()) for f in args.parts],
                              args.methods.split(",") if args.methods else None)
    except (ConfigError, json.JSONDecodeError) as e:
        p.error(str(e))
    print(format_table(pooled))
    if args.json:
        args.json.write_text(json.dumps(pooled, indent=1))


if __name__ == "__main__":
    main()
