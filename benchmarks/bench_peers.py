"""``ragpic bench`` with reference prefills timed beside the methods, on the same token ids
(docs/RESULTS.md §8 and §17): every ``ragpic bench`` option, plus ``--peers`` and ``--gguf``.

- ``hf-generate``: what a user of plain transformers waits for the first token:
  ``model.generate(ids, max_new_tokens=1)`` with the model on transformers' own ``sdpa``
  attention (ragpic's attention function is switched off for the call, and back on after).
- ``llama.cpp``: llama-cpp-python's prefill (``Llama.eval``) of a GGUF file, when that package
  is installed (it builds from source, ~15 minutes on 2 cores; never a test dependency). With
  ``--answer-tokens N``, llama.cpp's own ``llama-bench`` instead (``llamacpp_bench.py``, built by
  ``benchmarks/llamacpp_build.sh``): its prefill of as many tokens, then ``N`` generated at that depth.

    python benchmarks/bench_peers.py --context-tokens 4096 --repeats 3 --no-memory \\
        --methods full,naive,legolink-16 --peers hf-generate --threads 2

Each peer is a function ``ids -> seconds`` for one prefill of ``ids`` (a list of ints), timed in
``run_bench``'s rotation (:data:`ragpic.eval.bench.Peer`).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from llamacpp_bench import find_llama_bench, llamacpp_answer  # a sibling: this script's folder is on sys.path
from ragpic.cli.eval import add_bench_args, check_bench, cmd_bench
from ragpic.cmdline import Parser, run_command
from ragpic.errors import ConfigError, UsageError
from ragpic.paths import DEFAULT_MODEL, default_gguf

if TYPE_CHECKING:
    from ragpic.core.model import LoadedModel
    from ragpic.eval.bench import Peer

__all__ = ["PEERS", "build_parser", "hf_generate", "main", "make_peer"]

PEERS = ("hf-generate", "llama.cpp")
PROG = "python benchmarks/bench_peers.py"


def hf_generate(lm: LoadedModel) -> Peer:
    """Seconds of ``lm.model.generate(ids, max_new_tokens=1)`` on transformers' own SDPA."""
    import torch

    model = lm.model

    @torch.inference_mode()
    def run(ids: Sequence[int]) -> float:
        x = torch.tensor([list(ids)], dtype=torch.long, device=lm.device)
        was = model.config._attn_implementation
        model.set_attn_implementation("sdpa")
        try:
            t0 = time.perf_counter()
            model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=1, do_sample=False,
                           pad_token_id=lm.tokenizer.eos_token_id)
            if lm.device.type == "cuda":
                torch.cuda.synchronize(lm.device)
            return time.perf_counter() - t0
        finally:
            model.set_attn_implementation(was)

    return run


def llamacpp(gguf: str, threads: int, n_ctx: int) -> Peer:
    """Seconds of llama.cpp's prefill of ``ids`` (flash attention on, ``threads`` threads)."""
    try:
        from llama_cpp import Llama
    except ImportError as exc:
        raise ConfigError("--peers llama.cpp needs llama-cpp-python (pip install llama-cpp-python; it builds "
                          "from source) and --gguf PATH") from exc
    llm = Llama(model_path=gguf, n_ctx=n_ctx, n_batch=512, n_threads=threads, flash_attn=True, verbose=False)

    def run(ids: Sequence[int]) -> float:
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(list(ids))
        return time.perf_counter() - t0

    return run


def make_peer(name: str, lm: LoadedModel, *, gguf: str | None = None, n_ctx: int = 8192) -> Peer:
    """The peer called ``name`` (one of :data:`PEERS`); llama.cpp reads ``gguf`` (default: the
    embedded model's own GGUF, when ``lm`` is the embedded model)."""
    import torch

    if name == "hf-generate":
        return hf_generate(lm)
    if name == "llama.cpp":
        if gguf is None and lm.name == DEFAULT_MODEL:
            gguf = str(default_gguf() or "")
        if not gguf:
            raise ConfigError("--peers llama.cpp needs --gguf PATH: the GGUF file of the benchmarked model")
        return llamacpp(gguf, torch.get_num_threads(), n_ctx)
    raise ConfigError(f"unknown peer {name!r}: choose from {', '.join(PEERS)}")


# ----- the command: ragpic bench's parser, checks and run, with the peers added ------------------


def _peer_list(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in PEERS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown peer {bad[0]!r}: choose from {', '.join(PEERS)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_args(p)
    p.add_argument("--peers", type=_peer_list, default=[],
                   help="reference prefills on the same ids, timed beside the methods: hf-generate "
                        "(plain transformers), llama.cpp (needs llama-cpp-python; with --answer-tokens, "
                        "llama-bench on --gguf, built by benchmarks/llamacpp_build.sh)")
    p.add_argument("--gguf", default=None, help="GGUF file for --peers llama.cpp (default: the embedded model's; "
                   "with --answer-tokens, a .gguf --model)")
    return p


def _answer_gguf(args) -> str | None:
    """The GGUF file llama-bench answers from: ``--gguf``, else a ``.gguf`` ``--model``."""
    return args.gguf or (args.model if str(args.model or "").endswith(".gguf") else None)


def check(args) -> None:
    """``ragpic bench``'s checks, then the peers' (before any model loads)."""
    check_bench(args)
    if args.gguf is not None and not Path(args.gguf).is_file():
        raise UsageError(f"--gguf {args.gguf}: no such file")
    if "llama.cpp" in args.peers and args.answer_tokens:  # the whole answer: llama.cpp's own llama-bench
        if find_llama_bench() is None:
            raise UsageError("--peers llama.cpp with --answer-tokens runs llama-bench: build it once with "
                             "benchmarks/llamacpp_build.sh (or set RAGPIC_LLAMA_BENCH); or drop that peer")
        if _answer_gguf(args) is None:
            raise UsageError("--answer-tokens with --peers llama.cpp needs --gguf PATH (or a .gguf --model)")
    elif "llama.cpp" in args.peers and importlib.util.find_spec("llama_cpp") is None:
        raise UsageError("--peers llama.cpp: llama-cpp-python is not installed (pip install "
                         "llama-cpp-python, which builds llama.cpp from source); or drop that peer")


def peers_for(args):
    """``cmd_bench``'s ``peers_for``: the asked peers on the loaded model; with ``--answer-tokens``,
    llama.cpp answers through llama-bench (its pp and tg rates at that depth) instead of timing a prefill."""
    def make(lm: LoadedModel):
        import torch

        names, answer = list(args.peers), None
        if args.answer_tokens and "llama.cpp" in names:
            gguf, names = _answer_gguf(args), [n for n in names if n != "llama.cpp"]
            answer = ("llama.cpp", lambda T: llamacpp_answer(gguf, T, args.answer_tokens, torch.get_num_threads(),
                                                             args.repeats))
        return {n: make_peer(n, lm, gguf=args.gguf, n_ctx=max(args.context_tokens)) for n in names}, answer

    return make


def _parse(argv: list[str]) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    check(args)
    args.func = lambda a: cmd_bench(a, peers_for(a))
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the command on ``argv`` (default ``sys.argv[1:]``); ``ragpic``'s exit codes."""
    return run_command(list(sys.argv[1:] if argv is None else argv), _parse, lambda _: PROG)


if __name__ == "__main__":
    sys.exit(main())
