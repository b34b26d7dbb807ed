"""``ragpic bench --answer-tokens N``: the time to a whole answer, not only to its first token.

Per method and context length: TTFT (the link), decode tok/s (``N - 1`` single-row steps after
the first token, which the link's logits give), the whole answer's seconds and the process's
peak resident memory, and the memory-bandwidth limit of the decode rate (weight bytes read per
token / measured bandwidth). llama.cpp's answer on the same GGUF beside them is a benchmark's
(``benchmarks/bench_peers.py --peers llama.cpp``, ``benchmarks/llamacpp_bench.py``).
"""

from __future__ import annotations

import resource
import time

import torch

from ragpic.core.model import LoadedModel
from ragpic.engine.request import LinkedRequest

__all__ = ["answer_row_fields", "bandwidth_gb_s", "decode_limit_tok_s", "peak_rss_mb", "time_answer"]


def time_answer(req: LinkedRequest) -> tuple[float, float, int]:
    """Decode a linked request to its end: ``(link s, decode s, tokens)``."""
    link_s = req.linked.seconds
    t0 = time.perf_counter()
    req.start()
    while not req.done:
        req.step()
    return link_s, time.perf_counter() - t0, len(req.result.token_ids)


def answer_row_fields(link: list[float], decode: list[float], tokens: list[int]) -> dict:
    """Medians of one method's runs: whole answer, decode rate."""
    from ragpic.eval.scoring import median

    rates = [(n - 1) / d for d, n in zip(decode, tokens) if n > 1 and d > 0]
    return {"answer_tokens": median(tokens), "answer_median_s": median([a + b for a, b in zip(link, decode)]),
            "decode_tok_s": median(rates) if rates else float("nan"), "answer_s": [a + b for a, b in zip(link, decode)]}


def peak_rss_mb() -> float:
    """This process's peak resident set, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bandwidth_gb_s(mb: int = 512, repeats: int = 5) -> float:
    """Measured read bandwidth of this machine's memory: the best of ``repeats`` sums over a
    ``mb`` MiB fp32 tensor (far larger than any cache), GB/s."""
    x = torch.ones(mb * 2**18)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best / 1e9


def decode_limit_tok_s(lm: LoadedModel, bandwidth: float) -> float:
    """The decode rate if every step read every weight byte once at ``bandwidth`` GB/s (the
    embedding excepted: a step reads one row of it)."""
    emb = lm.model.get_input_embeddings()
    skip = {id(t) for t in (*emb.parameters(), *emb.buffers())}
    held = {id(t): t.numel() * t.element_size() for t in (*lm.model.parameters(), *lm.model.buffers())
            if id(t) not in skip}
    return bandwidth * 1e9 / sum(held.values())
