"""The ``ragpic`` command line: an adapter over the engine, the evaluations, the store tools and
the server (docs/ARCHITECTURE.md §2).

- :mod:`~ragpic.cli.main`: the parser of every command and :func:`main` (exit codes);
- :mod:`ragpic.cmdline`: the argument types and checks every command shares, run before a
  model loads, and the exit codes (shared with ``python -m ragpic.demo``, so outside this
  package);
- one module per command family: :mod:`~ragpic.cli.eval` (``eval``, ``eval needle``,
  ``bench``), :mod:`~ragpic.cli.ruler` (``eval ruler``), :mod:`~ragpic.cli.store`
  (``store check|stats``), :mod:`~ragpic.cli.serve`, :mod:`~ragpic.cli.model`; ``demo``'s
  options live with the demo, in :mod:`ragpic.demo.options`.

``python -m ragpic.cli ...`` is the same as the ``ragpic`` console script.
"""

from ragpic.cli.main import build_parser, main, parse

__all__ = ["build_parser", "main", "parse"]
