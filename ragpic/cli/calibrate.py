"""``ragpic calibrate``: arguments, checks and the command (:mod:`ragpic.eval.calibrate` does the work).

Every argument is checked before the model loads; torch is imported only by the command.
"""

from __future__ import annotations

import argparse
import sys

from ragpic.checks import check_number
from ragpic.cli.eval import _check_common, _load, _progress, _write_json, add_model_args, add_prefix_arg
from ragpic.cli.ruler import TASK_NAMES, _task_list
from ragpic.cmdline import at_least, csv_of, method_list
from ragpic.config import Config
from ragpic.core.methods import parse_variant
from ragpic.errors import ConfigError, UsageError

DESCRIPTION = """Measure, once per model, how much of full's accuracy each link recipe keeps and
how much faster it links, so that method="auto" can pick per model.

The calibration set: RULER-style prompts (every task, --lengths, --samples each) from a seed
no evaluation uses, plus the first --musique questions of the bundled MuSiQue sample
(passages cut to 192 tokens, as in the documented `ragpic eval` run). full
and every recipe link the same ids side by side; per task a recipe's share is its mean
score over full's, and its speed-up the median of full's link time over its own. The result
is written beside the converted models, keyed by the model's fingerprint (its weights,
weight format, dtype and tokenizer: load the model the same way to use it), and
Config(method="auto", fidelity=0.97) then links with the fastest recipe that keeps the
fidelity on every task full can do (full scores >= 0.5 there). The table printed at the end
shows what auto picks. About 9 minutes for Qwen2.5-Coder-0.5B's GGUF on 2 CPU cores with
native bf16 (AVX512_BF16), about 19 in fp32 on AVX2.

--compile-behind M also runs every recipe on the RULER prompts' chunks compiled behind the M
chunks before them (rows named <recipe>@prevM), as a store compiled with
Config(compile_behind=M) or `ragpic compile --compile-behind M` holds them; --compile-head chat
puts each prompt's chat opening first (@chat@prevM: Config(compile_head=True)), --compile-head
text its whole leading text (@head@prevM: Config(compile_head=<your text>), the calibration
prompts' own instruction standing in for yours). auto then links a prompt that takes most of
its chunks from such entries with the fastest of those rows that keeps the fidelity (about
1.4 minutes more per recipe on the 0.5B)."""

DEFAULT_RECIPES = "fast,balanced,faithful"  # ragpic.eval.calibrate.DEFAULT_RECIPES: the presets


def _fidelity(text: str) -> float:
    try:
        return check_number("--fidelity", float(text), "a share of full's score in (0, 1], e.g. 0.97",
                            lambda v: 0 < v <= 1)
    except (ValueError, ConfigError) as e:
        raise argparse.ArgumentTypeError(str(e) if isinstance(e, ConfigError) else f"not a number: {text!r}") from None


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure each link recipe's share of full on a model, for method=auto",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipes", type=method_list(), default=DEFAULT_RECIPES.split(","),
                   help=f"comma list of link methods to calibrate (default: {DEFAULT_RECIPES})")
    p.add_argument("--tasks", type=_task_list, default=list(TASK_NAMES),
                   help=f"RULER tasks (default: all: {','.join(TASK_NAMES)})")
    p.add_argument("--lengths", type=csv_of(at_least(1024)), default=[2048],
                   help="prompt lengths in tokens (default: 2048)")
    p.add_argument("--samples", type=at_least(1), default=2, help="prompts per task and length (default: 2)")
    p.add_argument("--musique", type=at_least(0), default=8,
                   help="bundled MuSiQue questions in the set (default: 8; 0: none)")
    p.add_argument("--fidelity", type=_fidelity, default=0.97,
                   help="the share of full's score the table's 'auto picks' line holds recipes to (default: 0.97)")
    p.add_argument("--compile-behind", type=at_least(0), default=0, metavar="M",
                   help="also calibrate each recipe on chunks compiled behind the M before them (default: 0, not)")
    p.add_argument("--compile-head", choices=["none", "chat", "text"], default="none",
                   help="with --compile-behind: what your store's entries read first (Config.compile_head: none = "
                        "False, chat = True, text = your prompts' text before their first chunk); default none")
    p.add_argument("--dir", default=None, metavar="FOLDER",
                   help="where calibrations live (default: the ragpic cache folder, where auto looks)")
    add_model_args(p)
    add_prefix_arg(p)
    p.set_defaults(func=cmd_calibrate, check=check_calibrate, plot=None)


def check_calibrate(args) -> None:
    _check_common(args)
    if not args.recipes or all(r.lower() == "full" for r in args.recipes):
        raise UsageError("--recipes: list at least one method other than full (full is always run, as the reference)")
    if args.compile_behind:
        try:
            Config(compile_behind=args.compile_behind)  # its bound, in its words
            for r in args.recipes:
                if r.lower() != "full":
                    parse_variant(f"{r}@prev{args.compile_behind}")
        except ConfigError as e:
            raise UsageError(f"--compile-behind: {e}") from None


def cmd_calibrate(args) -> int:
    from dataclasses import replace

    from ragpic.engine.calibration_file import save_calibration, to_json
    from ragpic.eval.calibrate import format_calibration, run_calibration

    lm = _load(args)
    cal = run_calibration(lm, recipes=args.recipes, tasks=args.tasks, lengths=args.lengths, samples=args.samples,
                          musique=args.musique, progress=_progress(args), prefix_cache=args.prefix_cache,
                          behind=args.compile_behind,
                          head={"none": "", "chat": "chat", "text": "head"}[args.compile_head])
    cal = replace(cal, made={**cal.made, "command": "ragpic " + " ".join(args.argv)})
    print(format_calibration(cal, args.fidelity))
    path = save_calibration(cal, args.dir)
    print(f"wrote {path}", file=sys.stderr)
    _write_json(args.json_out, {"calibration": str(path), **to_json(cal)})
    return 0
