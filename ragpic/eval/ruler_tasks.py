"""RULER-style synthetic tasks (Hsieh et al., "RULER: What's the real context size of your
long-context language models?", 2024), generated offline from a seed over cached chunks.

Every sample is a prompt of about ``length`` tokens: the chat template's user turn holds the
task's intro, the context as chunks of ``chunk_tokens`` ids (:mod:`ragpic.eval.ruler_text`),
then the question with its answer-format instruction; RULER's answer prefix opens the
assistant turn. Tasks (RULER's names and templates):

- ``niah_single``: one "special magic number" needle in essay filler; ask its key.
- ``niah_multikey``: four needles with different keys; ask one.
- ``niah_multivalue``: four needles with one key; ask all its values.
- ``niah_multiquery``: four needles with different keys; ask all four.
- ``vt``: variable tracking, ``VAR A = 12345`` then ``VAR B = VAR A`` ...; every link of the
  chain sits in a later chunk than the one before (up to 4 hops, fewer when the prompt has
  fewer chunks), so following it needs attention across chunks; ask every variable.
- ``cwe``: common-word extraction, a numbered word list spread over the chunks in which 10
  words recur more often than the rest; ask the 10.

A sample depends only on (seed, task, length, index), the tokenizer and the haystack: each
draws from its own ``random.Random`` seeded with that tuple.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ragpic.eval.data import template_parts
from ragpic.eval.ruler_text import (ADJECTIVES, NOUNS, Chunk, FillerStream, chunk_sizes, fill_chunks, split_exact,
                                    token_count, vocabulary)

__all__ = ["TASKS", "RulerSample", "TaskSpec", "generate_sample", "generate_set"]

SYSTEM = "You are a helpful assistant."
NIAH_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
              "I will quiz you about the numbers afterwards.\n\n")
VT_INTRO = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
CWE_INTRO = ("Below is a numbered list of words. In these words, some appear more often than others. "
             "Memorize the ones that appear most often.\n\n")
VT_HOPS, CWE_WORDS, CWE_RARE_FREQ = 4, 10, 3


@dataclass(slots=True, frozen=True)
class RulerSample:
    """One prompt: ``prefix`` text, ``chunks`` (cached), ``suffix`` text; ``expected`` strings
    are scored by ``metric`` ("all": share found, RULER's string_match_all; "part": any found)."""

    task: str
    length: int
    index: int
    prefix: str
    chunks: tuple[Chunk, ...]
    suffix: str
    question: str
    expected: tuple[str, ...]
    metric: str
    max_new_tokens: int
    needles: tuple[str, ...] = ()  # the sentences hidden in the chunks, in chain order for vt


@dataclass(slots=True, frozen=True)
class TaskSpec:
    # (rng, tokenizer, haystack, budget_of, chunk_tokens) -> (intro, chunks, question, answer prefix,
    # expected strings, needle sentences)
    build: Callable
    metric: str
    max_new_tokens: int


def _magic_number(rng: random.Random, used: set) -> str:
    while True:
        v = str(rng.randint(1_000_000, 9_999_999))
        if v not in used:
            used.add(v)
            return v


def _place(rng: random.Random, tok, sizes: Sequence[int],
           sentences: Sequence[str]) -> dict[int, list[tuple[float, str]]]:
    """Each sentence at a random chunk (weighted by its size, among those it still fits in) and
    a random depth in it."""
    room = [n - 8 for n in sizes]  # the margin ruler_text._fill_one keeps between the needles and the cut
    out: dict[int, list[tuple[float, str]]] = {}
    for s in sentences:
        need = token_count(tok, s) + 1
        fits = [i for i, r in enumerate(room) if r >= need]
        if not fits:
            raise ValueError(f"no chunk has room for {s!r}: raise --chunk-tokens or --lengths")
        i = rng.choices(fits, weights=[sizes[j] for j in fits])[0]
        room[i] -= need
        out.setdefault(i, []).append((rng.random(), s))
    return out


def _niah(n_keys: int, n_values: int, n_queries: int):
    def build(rng, tok, haystack, budget_of, chunk_tokens):
        pairs = rng.sample([f"{a}-{n}" for a in ADJECTIVES for n in NOUNS], n_keys)
        used: set = set()
        values = {k: [_magic_number(rng, used) for _ in range(n_values)] for k in pairs}
        needles = [f"One of the special magic numbers for {k} is: {v}." for k in pairs for v in values[k]]
        asked = rng.sample(pairs, n_queries)
        keys = asked[0] if n_queries == 1 else ", ".join(asked[:-1]) + f" and {asked[-1]}"
        many = n_values * n_queries > 1
        question = (f"What {'are all the special magic numbers' if many else 'is the special magic number'} "
                    f"for {keys} mentioned in the provided text? Answer with the "
                    f"{'numbers only, separated by commas' if many else 'number only'}.")
        answer = f"The special magic number{'s' if many else ''} for {keys} mentioned in the provided text " \
                 f"{'are' if many else 'is'}"
        sizes = chunk_sizes(budget_of(NIAH_INTRO, question, answer), chunk_tokens)
        chunks = fill_chunks(FillerStream(tok, haystack, rng), sizes, _place(rng, tok, sizes, needles))
        return NIAH_INTRO, chunks, question, answer, [v for k in asked for v in values[k]], needles
    return build


def _vt(rng, tok, haystack, budget_of, chunk_tokens):
    value = str(rng.randint(10_000, 99_999))
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    names: list[str] = []
    while len(names) < VT_HOPS + 1:
        name = "".join(rng.choice(letters) for _ in range(5))
        if name not in names:
            names.append(name)
    question = (f"Question: Find all variables that are assigned the value {value} in the text above. "
                "Answer with the variable names only, separated by commas.")

    def answer(n: int) -> str:
        return (f"Answer: According to the chain(s) of variable assignment in the text above, {n} "
                f"variables are assigned the value {value}, they are:")

    # the answer prefix names the count, so the budget is taken with the longest chain first
    sizes = chunk_sizes(budget_of(VT_INTRO, question, answer(VT_HOPS + 1)), chunk_tokens)
    if len(sizes) < 2:
        raise ValueError(f"variable tracking needs at least 2 chunks; raise --lengths above {chunk_tokens} "
                         "or lower --chunk-tokens")
    names = names[:min(VT_HOPS, len(sizes) - 1) + 1]
    links = [f"VAR {names[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in zip(names, names[1:])]
    where = sorted(rng.sample(range(len(sizes)), len(links)))  # one link per chunk, in order: the chain crosses them
    needles = {c: [(rng.random(), s)] for c, s in zip(where, links)}
    chunks = fill_chunks(FillerStream(tok, haystack, rng), sizes, needles)
    return VT_INTRO, chunks, question, answer(len(names)), names, links


def _cwe(rng, tok, haystack, budget_of, chunk_tokens):
    question = (f"Question: What are the {CWE_WORDS} most common words in the above list? "
                "Answer with the words only, separated by commas.")
    answer = f"Answer: The top {CWE_WORDS} words that appear most often in the list are:"
    budget = budget_of(CWE_INTRO, question, answer)
    pool = vocabulary(haystack)
    rng.shuffle(pool)
    common = pool[:CWE_WORDS]
    # no rare word inside a common one or around it: substring scoring stays unambiguous
    rare_pool = [w for w in pool[CWE_WORDS:] if not any(w in c or c in w for c in common)]
    listing = lambda words: " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))  # noqa: E731
    per_entry = token_count(tok, listing(rare_pool[:500] * 3)) / len(rare_pool[:500] * 3)
    entries = int(budget / per_entry)
    freq = max(CWE_RARE_FREQ + 1, min(30, entries // (2 * CWE_WORDS)))  # RULER: 30, scaled down to fit
    order = rng.getrandbits(64)

    def words_with(n_rare: int) -> list[str]:
        words = common * freq + rare_pool[:n_rare] * CWE_RARE_FREQ
        random.Random(order).shuffle(words)
        return words

    # the most rare words that fit: whole-list count with a token of slack per chunk boundary
    slack = budget // chunk_tokens + 1
    lo, hi, best = 0, min(len(rare_pool), 2 * entries // CWE_RARE_FREQ + 1), -1
    while lo <= hi:
        mid = (lo + hi) // 2
        if token_count(tok, listing(words_with(mid))) <= budget - slack:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    if best < 0:
        raise ValueError(f"--lengths: {budget} tokens cannot hold {CWE_WORDS} words x {freq}; ask for a longer prompt")
    chunks = split_exact(tok, listing(words_with(best)), chunk_tokens)
    while sum(len(c.ids) for c in chunks) > budget and best > 0:  # boundaries cost more than the slack
        best -= 1
        chunks = split_exact(tok, listing(words_with(best)), chunk_tokens)
    if sum(len(c.ids) for c in chunks) > budget:
        raise ValueError(f"--lengths: {budget} tokens cannot hold {CWE_WORDS} words x {freq}; ask for a longer prompt")
    return CWE_INTRO, chunks, question, answer, common, ()


TASKS: dict[str, TaskSpec] = {
    "niah_single": TaskSpec(_niah(1, 1, 1), "all", 32),
    "niah_multikey": TaskSpec(_niah(4, 1, 1), "all", 32),
    "niah_multivalue": TaskSpec(_niah(1, 4, 1), "all", 64),
    "niah_multiquery": TaskSpec(_niah(4, 1, 4), "all", 64),
    "vt": TaskSpec(_vt, "all", 48),
    "cwe": TaskSpec(_cwe, "all", 64),
}


def generate_sample(tokenizer, haystack: str, task: str, length: int, index: int, *, seed: int = 0,
                    chunk_tokens: int = 512) -> RulerSample:
    """Sample ``index`` of ``task`` at ``length`` tokens (prefix + chunks + suffix <= length)."""
    if task not in TASKS:
        raise ValueError(f"unknown RULER task {task!r}: choose from {', '.join(TASKS)}")
    spec = TASKS[task]
    rng = random.Random(f"ragpic-ruler/{seed}/{task}/{length}/{index}")
    before, after = template_parts(tokenizer, SYSTEM)
    frame = lambda intro, question, answer: (before + intro, f"\n\n{question}{after}{answer}")  # noqa: E731

    def budget_of(intro: str, question: str, answer: str) -> int:
        prefix, suffix = frame(intro, question, answer)
        return length - token_count(tokenizer, prefix) - token_count(tokenizer, suffix)

    intro, chunks, question, answer, expected, needles = spec.build(rng, tokenizer, haystack, budget_of, chunk_tokens)
    prefix, suffix = frame(intro, question, answer)
    return RulerSample(task, length, index, prefix, tuple(chunks), suffix, question, tuple(expected),
                       spec.metric, spec.max_new_tokens, tuple(needles))


def generate_set(tokenizer, haystack: str, tasks: Sequence[str], lengths: Sequence[int], samples: int, *,
                 seed: int = 0, chunk_tokens: int = 512) -> list[RulerSample]:
    """Every (task, length, index) sample, in that order."""
    return [generate_sample(tokenizer, haystack, t, n, i, seed=seed, chunk_tokens=chunk_tokens)
            for t in tasks for n in lengths for i in range(samples)]
