"""Requests with Zipf(s) popularity over a corpus of chunks, and what a cache of them serves:
the workload of ``benchmarks/sim_eviction.py`` and the hot-set rates of ``ragpic store plan``
(docs/SCALING.md, *Hit rate of a hot set*).

A chunk of rank ``i`` (1-based) is asked with probability ``i^-s / H(N, s)``. The static top-k
of that popularity hits ``H(k, s) / H(N, s)``, the best any cache of ``k`` entries does on
independent requests; :func:`lru_hit_rate` simulates an LRU of the same capacity.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["harmonic", "lru_hit_rate", "lru_hits", "top_k_hit_rate", "zipf_weights"]


def zipf_weights(n: int, s: float) -> list[float]:
    """Request probabilities of ranks 1..n under Zipf(``s``): ``i**-s`` normalised."""
    w = [1.0 / (i + 1) ** s for i in range(n)]
    total = sum(w)  # plain sum: the request draws of benchmarks/sim_eviction.py stay as they were
    return [x / total for x in w]


_HEAD = 1000  # terms summed exactly before Euler-Maclaurin takes over


def harmonic(n: int, s: float) -> float:
    """``H(n, s) = sum(i**-s for i in 1..n)``, fast for any ``n``: the first 1000 terms summed,
    the tail by Euler-Maclaurin to the B6 term (error ~ s**7 1000**-(s+7), far below 1e-12)."""
    if n <= 0:
        return 0.0
    if s < 0:
        raise ValueError(f"the Zipf exponent must be >= 0, got {s}")
    m = min(n, _HEAD)
    head = math.fsum(i ** -s for i in range(1, m + 1))
    if n == m:
        return head
    a, b = float(m), float(n)
    integral = math.log(b / a) if abs(1 - s) < 1e-12 else (b ** (1 - s) - a ** (1 - s)) / (1 - s)

    def deriv(x: float, order: int) -> float:  # d^order/dx^order of x**-s
        c = 1.0
        for j in range(order):
            c *= -(s + j)
        return c * x ** (-s - order)

    tail = integral + (b ** -s - a ** -s) / 2  # sum over a..b minus f(a) (a was in the head)
    for coef, order in ((1 / 12, 1), (-1 / 720, 3), (1 / 30240, 5)):
        tail += coef * (deriv(b, order) - deriv(a, order))
    return head + tail


def top_k_hit_rate(n: int, s: float, k: int) -> float:
    """Hit rate of a cache holding the ``k`` most popular of ``n`` chunks: ``H(k, s) / H(n, s)``."""
    if n <= 0:
        raise ValueError(f"the corpus must hold at least one chunk, got {n}")
    k = max(0, min(k, n))
    return 1.0 if k == n else harmonic(k, s) / harmonic(n, s)


def lru_hits(requests: Sequence[int], capacity: int, warmup: int = 0) -> int:
    """Hits of an LRU of ``capacity`` entries on ``requests``, counted after the first ``warmup``."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for i, r in enumerate(requests):
        if r in cache:
            hits += i >= warmup
            cache.move_to_end(r)
        elif capacity > 0:
            cache[r] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return hits


def lru_hit_rate(n: int, s: float, capacity: int, requests: int | None = None, seed: int = 0) -> float:
    """Steady-state hit rate of an LRU of ``capacity`` entries under Zipf(``s``) over ``n`` chunks:
    ``requests`` draws (default ``20 n``, at least 100,000), the first fifth not counted."""
    requests = requests or max(20 * n, 100_000)
    rng = random.Random(seed)
    cum = list(itertools.accumulate(zipf_weights(n, s)))
    draws = rng.choices(range(n), cum_weights=cum, k=requests)
    warmup = requests // 5
    return lru_hits(draws, capacity, warmup) / (requests - warmup)
