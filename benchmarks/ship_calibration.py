"""Turn a `ragpic calibrate` result into a calibration that ships inside the package.

    python benchmarks/ship_calibration.py --from ~/.cache/ragpic/calibration/<fingerprint>.json \
        --model qwen2.5-coder-0.5b --command "ragpic calibrate --model ... --lengths 4096 --samples 4" \
        [--machine "..."] [--date 2026-12-07]

Keeps the rows of the presets (``ragpic.core.methods.PRESETS``: ``auto`` chooses among them; a row
whose recipe is a preset's is named by the preset), keys the file by the SHA-256 of the model's
GGUF file (the registry's committed hash, or the embedded SmolLM2's file), records the command,
the machine and the date, and writes ``ragpic/data/calibrations/<model>.json``. The rows it drops
stay in the result file under docs/results/.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ragpic.core.methods import PRESETS, parse_method  # noqa: E402
from ragpic.engine.calibration_file import read_calibration, to_json  # noqa: E402


def source_sha256(model: str) -> str:
    if model == "smollm2-135m":
        from ragpic.core.gguf import known_sha256
        from ragpic.paths import default_gguf

        return known_sha256(default_gguf())
    from ragpic.models.registry import pinned_model

    return pinned_model(model).sha256


def preset_rows(cal):
    out = []
    for r in cal.recipes:
        name = next((p for p in PRESETS if parse_method(p) == r.recipe.method), None)
        if name is not None:
            out.append(replace(r, recipe=replace(r.recipe, method=parse_method(name))))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="source", required=True, help="a calibration file `ragpic calibrate` wrote")
    p.add_argument("--model", required=True, help="smollm2-135m or a `ragpic model list` name")
    p.add_argument("--command", required=True, help="the command that made it")
    p.add_argument("--machine", default="", help="where it ran (default: as the file says)")
    p.add_argument("--date", default="", help="when it ran (default: as the file says)")
    args = p.parse_args()
    raw = json.loads(Path(args.source).expanduser().read_text())
    cal = read_calibration({"version": 1, **raw})  # `ragpic calibrate --json` of version 1 wrote no version
    rows = preset_rows(cal)
    if not rows:
        raise SystemExit(f"{args.source} holds no preset's row ({', '.join(PRESETS)}): nothing auto could choose")
    made = {**cal.made, "command": args.command, **({"machine": args.machine} if args.machine else {}),
            **({"date": args.date} if args.date else {})}
    shipped = replace(cal, model=args.model, recipes=rows, source_sha256=source_sha256(args.model), made=made)
    out = ROOT / "ragpic" / "data" / "calibrations" / f"{args.model}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(to_json(shipped), indent=1) + "\n")
    print(f"wrote {out.relative_to(ROOT)}: {', '.join(r.name for r in rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
