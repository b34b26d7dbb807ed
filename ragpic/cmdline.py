"""What every ragpic command line shares: argument types and checks, the parser, exit codes.

Used by ``ragpic`` (:mod:`ragpic.cli`) and by ``python -m ragpic.demo`` (:mod:`ragpic.demo`),
so it sits below both and imports neither. Stdlib only (no torch): every check runs before a
model is loaded, so a wrong argument costs a second, not the 20-30 s of loading a model, and
fails with one line that names the argument and says what to pass. Checks raise
:class:`ragpic.errors.UsageError`; :func:`run_command` prints it and returns 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from ragpic.core.methods import parse_method, parse_variant  # stdlib-only, as kv_quant
from ragpic.errors import ConfigError, RagPicError, UsageError

__all__ = ["DTYPE_HELP", "Parser", "at_least", "csv_of", "fraction", "method_name", "method_list", "device_name",
           "need_module", "need_folder", "need_file", "check_model", "check_output", "run_command"]

COMPILE_HEAD_HELP = ("with --compile-behind: the text your prompts put before their first chunk, inside the user turn "
                     "(e.g. LlamaIndex's 'Context information is below.\\n---...\\n'); each entry compiled in order "
                     "reads the chat opening and then it (Config.compile_head), and links only into prompts that start "
                     "so (default: none, the chunks before only); give `ragpic compile` and `ragpic serve` the same TEXT")
"""``ragpic compile`` and ``ragpic serve``'s ``--compile-head`` (one text: the two must agree)."""

DTYPE_HELP = ("model dtype (default: bf16 on a GPU and under quantized weights, which --weights auto picks for a "
              ".gguf on a CPU with native bf16; else fp32; auto: bf16 also on a dense model on a CPU with native "
              "bf16, AVX512_BF16/AMX)")
"""``--dtype``'s help, the same for every command that loads a model (the rule is
:func:`ragpic.core.weights.resolve.resolve_weights`'s)."""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (no usage dump) and raise :class:`UsageError`."""

    def error(self, message: str):  # argparse calls this for every parse error
        raise UsageError(f"{message} (see `{self.prog} --help`)", prog=self.prog)


def at_least(minimum: int, kind=int):
    """An argparse type: a number >= ``minimum``."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'} "
                                             f">= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {text!r}")
        return value
    parse.__name__ = f"{kind.__name__} >= {minimum}"
    return parse


def fraction(text: str) -> float:
    """An argparse type: a number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1] (0: start, 1: end), got {text!r}")
    return value


def csv_of(kind):
    """An argparse type: a comma-separated list, each item parsed by ``kind``."""
    def parse(text: str):
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list, e.g. 1024,2048")
        return [kind(t) for t in items]
    return parse


def method_name(text: str, *, variants: bool = False, experimental: bool = False, bare_legolink: bool = False) -> str:
    """An argparse type: a link method, as :func:`ragpic.core.methods.parse_method` reads it (a
    public name, or ``experimental:<recipe>``). ``experimental``: an evaluation's recipe, which may
    be an experimental one written bare; ``variants``: also the ``@head`` / ``@chat`` /
    ``@prev<m>`` / ``@int8`` / ``@int4`` variants (:func:`ragpic.core.methods.parse_variant`).
    ``bare_legolink``: a bare ``legolink`` passes (``ragpic bench`` gives it ``--k``)."""
    if bare_legolink and text.strip().lower() == "legolink":
        return text.strip()
    if "@" in text and not variants:
        raise argparse.ArgumentTypeError(f"{text!r}: '@' variants ('@head', '@chat', '@prev<m>', '@int8', '@int4') are "
                                         f"for the evaluations only; give the method alone, e.g. legolink-16")
    try:
        parse_variant(text) if variants else parse_method(text, experimental=experimental)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text.strip()


def method_list(*, variants: bool = False, bare_legolink: bool = False):
    """An argparse type: a comma-separated list of named link methods, an evaluation's (so
    experimental recipes may be written bare; not ``auto``, which the engine resolves per model)."""
    def one(text: str) -> str:
        name = method_name(text, variants=variants, experimental=True, bare_legolink=bare_legolink)
        if name.partition("@")[0].strip().lower() == "auto":
            raise argparse.ArgumentTypeError("'auto' is chosen per model from its calibration: list the recipes "
                                             "to compare (`ragpic calibrate` shows which one auto picks)")
        return name
    return csv_of(one)


_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def device_name(text: str) -> str:
    """An argparse type: ``auto``, ``cpu``, ``mps``, ``cuda`` or ``cuda:N``."""
    if not _DEVICE.match(text.strip().lower()):
        raise argparse.ArgumentTypeError(f"expected auto, cpu, mps, cuda or cuda:N, got {text!r}")
    return text.strip().lower()


def need_module(module: str, what: str, extra: str) -> None:
    """Fail early when an optional dependency is missing, naming the pip extra that has it."""
    if importlib.util.find_spec(module) is None:
        raise UsageError(f"{what} needs the Python package {module!r}: pip install 'ragpic[{extra}]'")


def need_folder(option: str, path: str | Path, *, pattern: str = "*.txt", what: str = "a folder of .txt files") -> Path:
    """``path`` must be an existing folder holding at least one ``pattern`` file."""
    p = Path(path).expanduser()
    if not p.exists():
        raise UsageError(f"{option} {path}: no such folder; pass {what}")
    if not p.is_dir():
        raise UsageError(f"{option} {path}: not a folder; pass {what}")
    if not any(p.glob(pattern)):
        raise UsageError(f"{option} {path}: no {pattern} files in it; pass {what}")
    return p


def need_file(option: str, path: str | Path, what: str) -> Path:
    """``path`` must be an existing, readable file."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"{option} {path}: {'not a file' if p.exists() else 'no such file'}; pass {what}")
    try:
        with p.open("rb") as f:
            f.read(1)
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot read it ({e.strerror or e}); pass {what}") from None
    return p


def check_model(model: str | None) -> None:
    """``--model``: an existing HF model folder, a ``.gguf`` file, or a hub id already in the local cache.

    A value that looks like a path (``/``, ``.``, ``~`` first) must exist; anything else is left
    to the loader (a cached hub id such as ``HuggingFaceTB/SmolLM2-360M-Instruct``). A ``.gguf``
    file's header is read here (under a second): an unsupported architecture or a truncated
    file is refused before anything is dequantized.
    """
    if model is None:
        return
    what = ("pass a Hugging Face model folder or a .gguf file (`ragpic model list`), "
            "or omit --model for the embedded SmolLM2-135M-Instruct")
    p = Path(model).expanduser()
    if p.is_file() and p.suffix.lower() == ".gguf":
        from ragpic.core.gguf import check_gguf  # stdlib + the gguf package's type table: no torch
        from ragpic.errors import ModelFileError, UnsupportedModelError

        try:
            check_gguf(p, option="--model")
        except (ModelFileError, UnsupportedModelError) as e:
            raise UsageError(str(e)) from None
    elif p.exists():
        if not (p / "config.json").is_file():
            raise UsageError(f"--model {model}: no config.json in it; {what}")
    elif model.startswith(("/", ".", "~")) or p.suffix.lower() == ".gguf":
        raise UsageError(f"--model {model}: no such {'file' if p.suffix.lower() == '.gguf' else 'folder'}; {what}")


def check_output(option: str, path: str | None) -> None:
    """An output file path (``--json``, ``--plot``) must not name an existing folder."""
    if path and Path(path).expanduser().is_dir():
        raise UsageError(f"{option} {path}: is a folder; pass a file name, e.g. out/result.json")


def run_command(argv: list[str], parse: Callable[[list[str]], argparse.Namespace], prog: Callable[[list[str]], str]) -> int:
    """Parse ``argv`` with ``parse`` (which checks it), run ``args.func(args)``; returns the exit code.

    0 done; 2 a usage error (one line naming the argument, prefixed with ``prog(argv)`` unless
    the error knows its command); 1 an error while running (one line; ``RAGPIC_DEBUG=1`` shows
    the traceback); 130 interrupted.
    """
    debug = bool(os.environ.get("RAGPIC_DEBUG"))
    try:
        args = parse(argv)
        return args.func(args) or 0
    except UsageError as e:
        print(f"{e.prog or prog(argv)}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ragpic: interrupted", file=sys.stderr)
        return 130
    except (RagPicError, ValueError, OSError, ImportError) as e:
        if debug:
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"ragpic: error: {first} ({type(e).__name__}; RAGPIC_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
