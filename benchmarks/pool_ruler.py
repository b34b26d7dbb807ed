"""Pool ``ragpic eval ruler`` JSONs into one table: a bar measured in parts (docs/RESULTS.md §29).

A bar such as "every RULER task at 8 samples" is often run in parts: the tasks that separate
methods first, the others later, or several seeds. This reads the parts' ``--json`` files,
keeps the methods every part ran (or ``--methods``), and prints ``ragpic eval ruler``'s table
over all their samples (:func:`pool_results`). Speed-ups stay per sample
against ``full`` in its own run; pool only runs from one machine and settings.

    python benchmarks/pool_ruler.py A.json B.json [--methods full,qr-4-k4-h1-w-s] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from ragpic.errors import ConfigError
from ragpic.eval.ruler import format_table, summaries


def pool_results(results: Sequence[dict], methods: Sequence[str] | None = None) -> dict:
    """Several ``ragpic eval ruler --json`` results as one: their samples together, summarised again.

    For a bar measured in parts (tasks, seeds or methods run apart on one machine): ``methods``
    (default: every method all the results ran, in the first one's order; ``full`` is always
    kept) are kept per sample, the rest dropped. A sample's speed-up is against ``full`` in its
    own run, so pooled medians mix runs only as far as the runs' machines agree. Returns
    ``{"config", "samples", "summary", "overall"}`` as ``run_ruler`` does; ``config`` lists
    each part's under ``"parts"``.

    Raises:
        ConfigError: no results, a result that is not ``run_ruler``'s, or a named method
            that some result did not run.
    """
    if not results:
        raise ConfigError("pool_results: results is empty: pass the dicts run_ruler returned (or their JSON files, read)")
    for i, r in enumerate(results):
        if not (isinstance(r, dict) and isinstance(r.get("samples"), list)
                and isinstance(r.get("config"), dict) and "methods" in r["config"]):
            raise ConfigError(f"pool_results: result {i} is not a run_ruler result (it needs 'config' with "
                              "'methods', and 'samples'): pass what ragpic eval ruler --json wrote")
    ran = [r["config"]["methods"] for r in results]
    if methods is None:
        methods = [m for m in ran[0] if all(m in r for r in ran)]
    methods = ["full"] + [m for m in methods if m != "full"]
    for i, r in enumerate(ran):
        missing = [m for m in methods if m not in r]
        if missing:
            raise ConfigError(f"pool_results: result {i} did not run {missing} (it ran {r}): "
                             "pass methods= with the ones every result ran")
    records = [{**s, "methods": {m: s["methods"][m] for m in methods}} for r in results for s in r["samples"]]
    tasks = list(dict.fromkeys(s["task"] for s in records))
    lengths = sorted({s["length"] for s in records})
    return {"config": {"methods": methods, "tasks": tasks, "lengths": lengths,
                       "parts": [r["config"] for r in results]},
            **summaries(records, tasks, lengths, methods)}


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
