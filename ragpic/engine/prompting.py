"""Prompt text the engine builds and checks: chat templates, message validation, and the
diagnosis of retrieval hints that are not in the prompt (a silent cache miss otherwise)."""

from __future__ import annotations

from collections.abc import Sequence

from ragpic.checks import check_text
from ragpic.errors import ConfigError

__all__ = ["TEMPLATE_MARK", "check_messages", "first_difference", "format_chat", "leading_text", "missing_hints_message",
           "partly_in", "unlinked_hints_message"]


def format_chat(tokenizer, messages: Sequence[dict], *, add_generation_prompt: bool = True) -> str:
    """Messages -> the model's chat-template text (ending with the assistant turn opener when
    ``add_generation_prompt``); ``role: content`` lines for tokenizers without a template."""
    if not getattr(tokenizer, "chat_template", None):
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + ("assistant: " if add_generation_prompt else "")
    return tokenizer.apply_chat_template(list(messages), tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


TEMPLATE_MARK = "\u2063ragpic-context\u2063"  # in no template or document: where a template's documents go


def leading_text(messages: Sequence[dict], variable: str) -> tuple[str | None, str]:
    """``(system, head)`` of a framework's prompt template formatted with :data:`TEMPLATE_MARK`
    as ``variable``: its system message (``None`` without one) and the text its first user
    message has before the mark, what ``Config(system_prompt=..., compile_head=...)`` take so a
    document's chunks compiled in order read the prompt's own start (docs/ARCHITECTURE.md
    §1.3). A ConfigError, naming ``variable``, for another layout."""
    at = next((i for i, m in enumerate(messages) if TEMPLATE_MARK in m["content"]), None)
    if at is None or messages[at]["role"] != "user" or at > 1 or any(m["role"] != "system" for m in messages[:at]):
        raise ConfigError(f"the template must have {{{variable}}} in its first user message, after at most one "
                          f"system message; write Config(system_prompt=..., compile_head=...) by hand for other "
                          f"layouts")
    head = messages[at]["content"][:messages[at]["content"].index(TEMPLATE_MARK)]
    if not head:
        raise ConfigError(f"the template puts nothing before {{{variable}}} in its user message: use "
                          f"Config(compile_head=True) (the chat opening alone)")
    return (messages[0]["content"] if at else None), head


def check_messages(messages: object) -> list[dict]:
    """Chat messages as a list of ``{"role": str, "content": str}`` dicts, or a ConfigError
    naming ``prompt`` (``None``, a number or a malformed message would fail deep inside the
    chat template otherwise)."""
    if isinstance(messages, dict) or not isinstance(messages, Sequence) or not messages:
        raise ConfigError(f"prompt must be a str or a non-empty list of {{'role', 'content'}} messages, "
                          f"got {type(messages).__name__} {messages!r:.40}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise ConfigError(f"prompt[{i}] must be a {{'role': str, 'content': str}} dict, got {m!r:.60}")
        check_text(f"prompt[{i}]['content']", m["content"])
    return list(messages)


def _longest(found, text: str) -> int:
    """Largest ``n`` with ``found(n)`` true, for a ``found`` that is monotone (true up to some
    ``n``, false after): binary search, ``O(log len(text))`` substring searches."""
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if found(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def first_difference(prompt: str, text: str) -> tuple[int, str, str]:
    """Where ``text`` stops matching ``prompt``: ``(n, text_after, prompt_after)`` for the longest
    prefix ``text[:n]`` found in the prompt, with up to 20 characters of each after it."""
    n = _longest(lambda k: text[:k] in prompt, text)
    at = prompt.find(text[:n]) + n if n else -1
    return n, text[n:n + 20], prompt[at:at + 20] if at >= 0 else ""


def partly_in(prompt: str, text: str, least: int = 16) -> bool:
    """Whether ``text`` is not in ``prompt`` whole but its first or last ``least`` characters
    are: it was changed on its way into the prompt (reflowed, re-split, metadata edited). A
    text that is absent altogether (a refine step holds one node of several) is no miss."""
    if text in prompt or len(text) < 2 * least:
        return False
    return text[:least] in prompt or text[-least:] in prompt


def missing_hints_message(prompt: str, hints: Sequence[str], changed: Sequence[str]) -> str:
    """One line: how many hints reached the prompt changed, and how the first one differs."""
    first = changed[0]
    n, hint_after, prompt_after = first_difference(prompt, first)
    where = (f"its first {n} characters are in the prompt, then the hint has {hint_after!r} where the "
             f"prompt has {prompt_after!r}" if n >= 16 else "its start differs, its end is in the prompt")
    return (f"{len(changed)} of {len(hints)} retrieval hints are in the prompt only in part, so their stored KV "
            f"cannot be linked (that text is computed instead). Hint {list(hints).index(first)} "
            f"({first[:40]!r}...): {where}. Compile exactly the text your prompt contains (e.g. what "
            f"format_docs puts there), and keep node text whole (see make_query_engine).")


def unlinked_hints_message(prompt: str, hints: Sequence[str], unlinked: Sequence[str], cut: int | None) -> str:
    """One line: how many hints are in the prompt whole yet not linked, and why the first one is
    not: ``cut``, where it starts or ends inside a word that no linked piece completes (a
    document cut inside words lost the piece beside it, docs/ARCHITECTURE.md §1.3), else (``None``)
    it overlaps a linked hint."""
    first = unlinked[0]
    if cut is not None:
        why = (f"it {'starts' if cut == prompt.find(first) else 'ends'} inside the word "
               f"{prompt[max(0, cut - 10):cut]!r} + {prompt[cut:cut + 10]!r} and no linked hint meets it there, so it "
               "cannot be told from a match inside a longer word. A document cut inside words links only where its "
               "pieces meet: pass every piece between the first and the last as hints and compile them "
               "(compile(pieces, in_order=True, separator='')), or cut on word boundaries")
    else:
        why = "it overlaps another hint that was linked there (the earlier, then the longer, wins)"
    return (f"{len(unlinked)} of {len(hints)} retrieval hints are in the prompt whole but not linked (that text is "
            f"computed instead). Hint {list(hints).index(first)} ({first[:40]!r}...): {why}.")
