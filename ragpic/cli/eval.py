"""``ragpic eval``, ``ragpic eval needle`` and ``ragpic bench``: arguments, checks, commands.

Defaults read the data shipped in ``ragpic/data`` (32 MuSiQue questions, four Paul Graham
essays), so each command runs from a clone with no path argument. Every argument is checked
before the model loads (:mod:`ragpic.cmdline`); torch is imported only by the commands.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from ragpic.cmdline import (DTYPE_HELP, Parser, at_least, check_model, check_output, csv_of, device_name, fraction,
                            method_list, need_file, need_folder, need_module)
from ragpic.errors import UsageError
from ragpic.eval.data import default_dataset, default_haystack, load_qa, parse_chunking
from ragpic.core.weights import NAMES as WEIGHT_NAMES

EVAL_DESCRIPTION = """Accuracy and fidelity to `full` of every link method on multi-hop QA.

Each question's passages are compiled as chunks and every method answers from the same
token sequence; reported per method: gold F1/EM, agreement with `full`'s answer, and the
teacher-forced top-1 agreement and KL(full || method) with 95% bootstrap intervals.
Default data: the 32 MuSiQue questions shipped in ragpic/data (CC BY 4.0). The documented
run: ragpic eval --limit 32 --passage-tokens 192. The needle test: ragpic eval needle --help;
RULER-style synthetic tasks: ragpic eval ruler --help."""

NEEDLE_DESCRIPTION = """Needle in a haystack (EPIC's setup): a sentence hidden at each depth of a
Paul Graham essay context, cut into 512-token cached chunks; every method answers greedily.
Reported per method and cell: F1 against the needle and hit (answer names "sandwich" and
"dolores park"). Default haystack: the four essays shipped in ragpic/data (prompts up to ~12k
tokens are the same as with the full 49-essay set)."""

BENCH_DESCRIPTION = """Link time (time to first token minus decode) of every method vs context
length, on the same token sequence per length: haystack text in cached chunks plus an
uncached query. Reports medians of interleaved repeats, the speed-up vs `full`, the
FLOP-count limit of that speed-up, and the link step's peak memory."""


def add_prefix_arg(p: argparse.ArgumentParser) -> None:
    """``--no-prefix-cache``, for the commands whose prompts have a leading text."""
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   help="recompute each prompt's leading text (template, instruction) in every linked method "
                        "instead of linking it from the rows full computed for it, as the engine does by "
                        "default (exact either way)")


def add_model_args(p: argparse.ArgumentParser) -> None:
    """Options every model-running command shares."""
    p.add_argument("--model", default=None,
                   help="HF model folder, cached hub id or .gguf file (`ragpic model list`; "
                        "default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", type=device_name, default="auto", help="auto (CUDA if present), cpu, cuda:0 ...")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default=None,
                   help=DTYPE_HELP)
    p.add_argument("--weights", choices=WEIGHT_NAMES, default="auto",
                   help="weight format (default auto: a .gguf keeps its own 4-bit blocks, the rest int4, in bf16, "
                        "on a CPU with native bf16; else dense); int8/int4: weight-only on torch's CPU kernels")
    p.add_argument("--hold-dense", action=argparse.BooleanOptionalAction, default=False,
                   help="under quantized weights, keep each layer's dequantized weight once made, so links "
                        "skip the dequantization (~1.2 s a pass on a 1.5B), for the dense weights' memory; "
                        "off by default, as Config()")
    p.add_argument("--threads", type=at_least(1), default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT", help="write the full results as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def add_eval_parser(sub) -> None:
    ev = sub.add_parser("eval", help="QA accuracy and fidelity to full of every link method "
                        "(`ragpic eval needle --help`: the needle test; `ragpic eval ruler --help`: RULER)",
                        description=EVAL_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    ev.add_argument("--dataset", default=None, help='JSON list of {"question", "answers", "ctxs": [{"title", '
                    '"text"}]} (default: the 32 MuSiQue questions in ragpic/data)')
    ev.add_argument("--limit", type=at_least(1), default=None, help="first N questions")
    ev.add_argument("--methods", type=method_list(variants=True), default=None,
                    help="comma list (default: full,naive,legolink-0,legolink-1,legolink-16,cacheblend-15); "
                         "a '@int8' or '@int4' suffix links KV stored in that format")
    ev.add_argument("--chunking", default="passage", help="passage (one chunk per passage) or tokens:N")
    ev.add_argument("--passage-tokens", type=at_least(1), default=None, help="cut each passage to its first N tokens")
    ev.add_argument("--max-new-tokens", type=at_least(1), default=32)
    ev.add_argument("--plot", default=None, metavar="OUT.png", help="bar chart of teacher-forced KL / top-1 with CIs")
    add_model_args(ev)
    add_prefix_arg(ev)
    ev.set_defaults(func=cmd_eval, check=check_eval)


def add_bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="link TTFT of every method vs context length",
                       description=BENCH_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_args(b)
    b.set_defaults(func=cmd_bench, check=check_bench)


def add_bench_args(b: argparse.ArgumentParser) -> None:
    """``ragpic bench``'s options (benchmarks/bench_peers.py adds its peers' to the same set)."""
    b.add_argument("--context-tokens", type=csv_of(at_least(64)), default=[1024, 2048, 4096, 8192],
                   help="comma list of prompt lengths (default: 1024,2048,4096,8192)")
    b.add_argument("--chunk-tokens", type=at_least(1), default=512)
    b.add_argument("--k", type=at_least(0), default=16, help="K of the default list's legolink-K")
    b.add_argument("--query-tokens", type=at_least(1), default=32)
    b.add_argument("--repeats", type=at_least(1), default=5)
    b.add_argument("--methods", type=method_list(bare_legolink=True), default=None,
                   help="comma list (default: full,naive,legolink-0,legolink-<k>,cacheblend-15)")
    b.add_argument("--haystack", default=None, help="folder of .txt files (default: the essays in ragpic/data/haystack)")
    b.add_argument("--no-memory", action="store_true", help="skip the profiled peak-memory pass")
    b.add_argument("--answer-tokens", type=at_least(0), default=0, metavar="N",
                   help="also decode N answer tokens per request: TTFT, decode tok/s, the whole answer's time, "
                        "peak RSS and the bandwidth limit")
    b.add_argument("--plot", default=None, metavar="OUT.png")
    add_model_args(b)


def build_needle_parser() -> argparse.ArgumentParser:
    p = Parser(prog="ragpic eval needle", description=NEEDLE_DESCRIPTION,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--haystack", default=None, help="folder of .txt essays (default: ragpic/data/haystack)")
    p.add_argument("--lengths", type=csv_of(at_least(256)), default=[1024, 2048, 4096],
                   help="comma list of prompt lengths in tokens (default: 1024,2048,4096)")
    p.add_argument("--depths", type=csv_of(fraction), default=[0, 0.25, 0.5, 0.75, 1.0],
                   help="comma list of needle depths in [0, 1] (default: 0,0.25,0.5,0.75,1)")
    p.add_argument("--methods", type=method_list(variants=True), default=None,
                   help="comma list (default: full,naive,legolink-0,legolink-1,legolink-16,cacheblend-15); "
                        "a '@int8' or '@int4' suffix links KV stored in that format")
    p.add_argument("--chunk-tokens", type=at_least(16), default=512)
    p.add_argument("--max-new-tokens", type=at_least(1), default=32)
    p.add_argument("--plot", default=None, metavar="OUT.png", help="heat maps (one panel per method + one file each)")
    add_model_args(p)
    add_prefix_arg(p)
    p.set_defaults(func=cmd_needle, check=check_needle)
    return p


# ----- checks (before any model loads) --------------------------------------------------------


def _check_common(args) -> None:
    check_model(args.model)
    check_output("--json", args.json_out)
    check_output("--plot", args.plot)
    if args.plot:
        need_module("matplotlib", "--plot", "notebooks")


def check_eval(args) -> None:
    _check_common(args)
    try:
        args.chunk_tokens = parse_chunking(args.chunking)
    except ValueError as e:
        raise UsageError(f"--chunking: {e}") from None
    what = 'a JSON list of {"question", "answers", "ctxs"} (or omit --dataset for the bundled questions)'
    path = need_file("--dataset", args.dataset, what) if args.dataset else default_dataset()
    try:
        args.examples = load_qa(path, args.limit)
    except (ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
        raise UsageError(f"--dataset {path}: {str(e).splitlines()[0]}; pass {what}") from None
    if not args.examples:
        raise UsageError(f"--dataset {path}: no questions in it; pass {what}")


def _haystack(args) -> str:
    if args.haystack is None:
        return str(default_haystack())
    return str(need_folder("--haystack", args.haystack, what="a folder of .txt files (or omit --haystack)"))


def _check_long_enough(args, option: str, longest: int) -> None:
    """A haystack far too short for the longest prompt asked for is refused (it would silently
    give shorter prompts). English runs ~4 characters per token; under 2 is surely too short."""
    chars = sum(p.stat().st_size for p in Path(args.haystack).glob("*.txt"))
    if chars < 2 * longest:
        raise UsageError(f"--haystack {args.haystack}: about {chars // 4} tokens of text, too short for "
                         f"{option} {longest}; pass a folder with more text or smaller {option}")


def check_needle(args) -> None:
    _check_common(args)
    args.haystack = _haystack(args)
    _check_long_enough(args, "--lengths", max(args.lengths))


def check_bench(args) -> None:
    _check_common(args)
    args.haystack = _haystack(args)
    _check_long_enough(args, "--context-tokens", max(args.context_tokens))
    short = [t for t in args.context_tokens if t <= args.query_tokens]
    if short:
        raise UsageError(f"--context-tokens {short[0]}: must exceed --query-tokens ({args.query_tokens})")


# ----- commands -------------------------------------------------------------------------------


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
    return load_model(args.model, device=args.device, dtype=args.dtype, weights=args.weights,
                      hold_dense=args.hold_dense)


def cmd_eval(args) -> int:
    from ragpic.eval.evaluate import evaluate_qa, format_table, plot_eval

    lm = _load(args)
    report = evaluate_qa(lm, args.examples, args.methods, chunk_tokens=args.chunk_tokens,
                         passage_tokens=args.passage_tokens, max_new_tokens=args.max_new_tokens,
                         progress=_progress(args), prefix_cache=args.prefix_cache)
    print(format_table(report.methods))
    _write_json(args.json_out, report.to_json())
    if args.plot:
        print(f"wrote {plot_eval(report.to_json(), args.plot)}", file=sys.stderr)
    return 0


def cmd_needle(args) -> int:
    from ragpic.eval.needle import format_table, plot_heatmaps, run_needle

    lm = _load(args)
    result = run_needle(lm, args.haystack, lengths=args.lengths, depths=args.depths, methods=args.methods,
                        chunk_tokens=args.chunk_tokens, max_new_tokens=args.max_new_tokens, progress=_progress(args),
                        prefix_cache=args.prefix_cache)
    print(format_table(result))
    _write_json(args.json_out, result)
    if args.plot:
        for p in plot_heatmaps(result, args.plot):
            print(f"wrote {p}", file=sys.stderr)
    return 0


def cmd_bench(args, peers_for=None) -> int:
    """``ragpic bench``. ``peers_for(lm) -> (peers, answer_peer)``: reference runs timed beside the
    methods on the same ids (benchmarks/bench_peers.py passes plain transformers' and llama.cpp's):
    ``peers`` maps a name to ``ids -> seconds``; ``answer_peer`` is None or ``(name, T -> its row)``."""
    import torch

    from ragpic.eval.answer import bandwidth_gb_s, decode_limit_tok_s, peak_rss_mb
    from ragpic.eval.bench import format_table, plot_bench, run_bench

    lm = _load(args)
    peers, answer_peer = peers_for(lm) if peers_for is not None else ({}, None)
    loaded_rss = peak_rss_mb()
    result = run_bench(lm, haystack_dir=args.haystack, context_tokens=args.context_tokens,
                       chunk_tokens=args.chunk_tokens, k=args.k, query_tokens=args.query_tokens,
                       repeats=args.repeats, methods=args.methods, measure_memory=not args.no_memory,
                       progress=_progress(args), peers=peers, answer_tokens=args.answer_tokens,
                       answer_peer=answer_peer[1] if answer_peer else None)
    result["config"].update(weights=str(lm.weights), weights_summary=lm.weights_summary,
                            cpu=torch.backends.cpu.get_cpu_capability())
    if args.answer_tokens:
        bw = bandwidth_gb_s()
        result["config"].update(answer_peer=answer_peer[0] if answer_peer else None, bandwidth_gb_s=bw,
                                decode_limit_tok_s=decode_limit_tok_s(lm, bw), loaded_peak_rss_mb=loaded_rss,
                                peak_rss_mb=peak_rss_mb())
        print(f"bandwidth {bw:.1f} GB/s -> decode limit {result['config']['decode_limit_tok_s']:.1f} tok/s; "
              f"peak RSS {peak_rss_mb():.0f} MiB", file=sys.stderr)
    weights = lm.weights_summary or f"weights {lm.weights} ({lm.dtype})"  # the summary names the format and why
    print(f"CPU {result['config']['cpu']}; {weights}", file=sys.stderr)
    print(format_table(result))
    _write_json(args.json_out, result)
    if args.plot:
        print(f"wrote {plot_bench(result, args.plot)}", file=sys.stderr)
    return 0
