"""How many core modules one generation crosses (docs/ARCHITECTURE.md §1).

A reader following one ``legolink-16`` request through the core should meet a handful of
modules, each holding one idea. This traces, with ``sys.setprofile``, which ``ragpic.core``
modules have a function (or a dataclass's generated method) called during one
``generate(..., max_new_tokens=1)`` after a warm-up, and bounds their number.
"""

from __future__ import annotations

import sys

from ragpic import Config, RagPic
from tiny import tiny_lm

PASSAGES = [
    "the quick brown fox jumps over the lazy dog near the park.",
    "a needle hides in the haystack near dolores park.",
    "answer: eat a sandwich and sit in the sun.",
]
PROMPT = "passages:\n" + "\n\n".join(PASSAGES) + "\n\nquestion: what is the best thing to do?"
MAX_CORE_MODULES = 12  # 10, then compile recipes left core/methods.py; then every forward went through core/runner.py


def core_modules_entered(fn) -> list[str]:
    """Sorted ``ragpic.core.*`` module names (less the prefix) whose functions ``fn()`` calls."""
    seen: set[str] = set()

    def profile(frame, event, arg):
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name.startswith("ragpic.core."):
                seen.add(name.removeprefix("ragpic.core."))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return sorted(seen)


def test_one_legolink_generation_crosses_at_most_twelve_core_modules():
    lm = tiny_lm("llama", num_hidden_layers=2)
    lm.model.generation_config.eos_token_id = None
    engine = RagPic(Config(store="memory", method="legolink-16", max_new_tokens=1), lm=lm)
    assert engine.compile(PASSAGES) == 3

    def generate():
        return engine.generate(PROMPT, hints=PASSAGES, max_new_tokens=1)

    warm = generate()
    assert warm.chunks_loaded == 3 and len(warm.token_ids) == 1
    entered = core_modules_entered(generate)
    print(f"{len(entered)} core modules: {', '.join(entered)}")
    assert "link" in " ".join(entered)  # the trace saw the link (a broken tracer sees nothing)
    assert len(entered) <= MAX_CORE_MODULES, entered
