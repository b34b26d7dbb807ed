"""``ragpic eval ruler``: arguments, checks and the command (shared options from :mod:`ragpic.cli.eval`).

Every argument is checked before the model loads; torch is imported only by the command.
"""

from __future__ import annotations

import argparse

from ragpic.cmdline import Parser, at_least, csv_of, method_list
from ragpic.errors import UsageError
from ragpic.cli.eval import _check_common, _check_long_enough, _haystack, _load, _progress, _write_json, add_model_args, add_prefix_arg

# the names of ragpic.eval.ruler_tasks.TASKS, kept here so parsing needs no import of the eval package
TASK_NAMES = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe")

RULER_DESCRIPTION = """RULER-style synthetic long-context tasks (Hsieh et al. 2024), generated offline
from --seed over cached chunks of --chunk-tokens tokens, Paul Graham essays as filler:

  niah_single      one "special magic number" needle; ask its key
  niah_multikey    four needles with different keys; ask one
  niah_multivalue  four values under one key; ask all four
  niah_multiquery  four keys; ask all four
  vt               variable tracking: VAR A = 12345, then VAR B = VAR A ... with each link
                   of the chain in a later chunk (up to 4 hops); ask every variable
  cwe              common-word extraction: a numbered word list over the chunks; ask the
                   10 most frequent words

The question (with an answer-format instruction) follows the chunks in the chat template's
user turn; RULER's answer prefix opens the assistant turn. A sample's text depends only on
the seed, the task, the length, its index and the tokenizer. Scored as RULER scores them:
the share of the expected values that appear in the answer (string_match_all). Reported per
task and length: each method's mean score, its ratio to full's (paired bootstrap 95% CI over
samples), answer identity with full, teacher-forced KL(full || method) on full's answer, and
the link-time speed-up over full. A length beyond the model's context window minus the
answer budget is cut to fit."""


def _task_list(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if t not in TASK_NAMES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown task {bad[0] if bad else text!r}: choose from "
                                         f"{', '.join(TASK_NAMES)}")
    return list(dict.fromkeys(names))


def build_ruler_parser() -> argparse.ArgumentParser:
    p = Parser(prog="ragpic eval ruler", description=RULER_DESCRIPTION,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=_task_list, default=list(TASK_NAMES),
                   help=f"comma list (default: all: {','.join(TASK_NAMES)})")
    p.add_argument("--lengths", type=csv_of(at_least(128)), default=[2048, 4096, 8192],
                   help="comma list of prompt lengths in tokens (default: 2048,4096,8192)")
    p.add_argument("--samples", type=at_least(1), default=4, help="samples per task and length (default: 4)")
    p.add_argument("--seed", type=int, default=0, help="the generated set depends only on it and the tokenizer")
    p.add_argument("--methods", type=method_list(variants=True), default=None,
                   help="comma list (default: full,naive,legolink-16,cacheblend-15,qr-10); "
                        "a '@int8' or '@int4' suffix links KV stored in that format")
    p.add_argument("--chunk-tokens", type=at_least(32), default=512, help="tokens per cached chunk (default: 512)")
    p.add_argument("--max-new-tokens", type=at_least(1), default=None,
                   help="answer budget for every task (default: each task's own, 32-64)")
    p.add_argument("--haystack", default=None, help="folder of .txt essays for filler (default: ragpic/data/haystack)")
    add_model_args(p)
    add_prefix_arg(p)
    p.set_defaults(func=cmd_ruler, check=check_ruler, plot=None)
    return p


def check_ruler(args) -> None:
    _check_common(args)
    args.haystack = _haystack(args)
    _check_long_enough(args, "--lengths", max(args.lengths))
    if "vt" in args.tasks and min(args.lengths) < 2 * args.chunk_tokens:
        raise UsageError(f"--lengths {min(args.lengths)}: variable tracking needs at least 2 chunks of "
                         f"--chunk-tokens {args.chunk_tokens}; pass longer --lengths or smaller --chunk-tokens")


def cmd_ruler(args) -> int:
    from ragpic.eval.ruler import format_table, run_ruler

    lm = _load(args)
    result = run_ruler(lm, args.haystack, tasks=args.tasks, lengths=args.lengths, samples=args.samples,
                       seed=args.seed, methods=args.methods, chunk_tokens=args.chunk_tokens,
                       max_new_tokens=args.max_new_tokens, progress=_progress(args), prefix_cache=args.prefix_cache)
    print(format_table(result))
    _write_json(args.json_out, result)
    return 0
