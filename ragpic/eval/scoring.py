"""Scoring: LongBench answer normalisation, F1 / exact match, logit fidelity, bootstrap.

Answer scoring follows LongBench's ``qa_f1_score`` (itself SQuAD's): lower-case, drop
punctuation and the articles a/an/the, collapse whitespace, then token-level F1; the
score against several gold answers is the max over them.
"""

from __future__ import annotations

import math
import random
import re
import statistics
import string
from collections import Counter
from collections.abc import Callable, Sequence

import torch

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """LongBench / SQuAD normalisation: lower, no punctuation, no articles, single spaces."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def f1_score(prediction: str, gold: str) -> float:
    """Token-level F1 between normalised strings (0 when either side is empty)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = Counter(pred) & Counter(ref)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def max_over(metric: Callable[[str, str], float], prediction: str, golds: Sequence[str]) -> float:
    """Best score of ``prediction`` against any gold answer (0 for no golds)."""
    return max((metric(prediction, g) for g in golds), default=0.0)


def string_match_all(prediction: str, expected: Sequence[str]) -> float:
    """RULER's ``string_match_all`` for one sample: the share of ``expected`` strings found in
    ``prediction`` (case-insensitive substring; 0 for no expected strings)."""
    low = prediction.lower()
    return sum(e.lower() in low for e in expected) / len(expected) if expected else 0.0


def string_match_part(prediction: str, expected: Sequence[str]) -> float:
    """RULER's ``string_match_part`` for one sample: 1 when any ``expected`` string is in
    ``prediction`` (case-insensitive substring), else 0."""
    low = prediction.lower()
    return float(any(e.lower() in low for e in expected))


def needle_hit(answer: str, keywords: Sequence[str] = ("sandwich", "dolores park")) -> bool:
    """The answer names every keyword (case-insensitive)."""
    low = answer.lower()
    return all(k in low for k in keywords)


def kl_divergence(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``KL(softmax(ref) || softmax(logits))`` per row, in fp32: ``(..., V) -> (...)``."""
    p_log = torch.log_softmax(ref_logits.float(), dim=-1)
    q_log = torch.log_softmax(logits.float(), dim=-1)
    return (p_log.exp() * (p_log - q_log)).sum(-1).clamp_min(0.0)


def top1_agreement(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``(...)`` float: 1 where both rows have the same argmax."""
    return (ref_logits.argmax(-1) == logits.argmax(-1)).float()


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.float().reshape(1, -1), b.float().reshape(1, -1))[0])


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def median(values: Sequence[float]) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def bootstrap_ci(values: Sequence[float], *, n_resamples: int = 2000, confidence: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (resampling the items with replacement).

    Deterministic for a given ``seed``. One value gives a zero-width interval; none gives NaNs.
    """
    vals = [float(v) for v in values]
    if not vals:
        return (float("nan"), float("nan"))
    if len(vals) == 1:
        return (vals[0], vals[0])
    rng = random.Random(seed)
    n = len(vals)
    return _percentile_interval([sum(vals[rng.randrange(n)] for _ in range(n)) / n for _ in range(n_resamples)],
                                confidence)


def wilson_ci(hits: Sequence[float], *, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a share of 0/1 outcomes (answer identity, needle hits).

    Unlike a bootstrap it is not zero-width at 0 of n or n of n, where a small sample says least
    (0 of 32 still allows up to ~11%). None gives NaNs.
    """
    n = len(hits)
    if not n:
        return (float("nan"), float("nan"))
    p = sum(float(h) for h in hits) / n
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (max(0.0, (centre - half) / (1 + z * z / n)), min(1.0, (centre + half) / (1 + z * z / n)))


def _percentile_interval(stats: list[float], confidence: float) -> tuple[float, float]:
    """The central ``confidence`` interval of bootstrap statistics (percentile method)."""
    stats = sorted(stats)
    alpha = (1 - confidence) / 2
    return (stats[max(0, math.floor(alpha * len(stats)))],
            stats[min(len(stats) - 1, math.ceil((1 - alpha) * len(stats)) - 1)])


def paired_ratio_ci(num: Sequence[float], den: Sequence[float], *, n_resamples: int = 2000,
                    confidence: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """``(mean(num) / mean(den), lo, hi)``: the ratio of two means over the same items, with a
    percentile bootstrap interval that resamples the items once for both (paired).

    Deterministic for a given ``seed``; NaNs when there are no items or ``den`` sums to 0.
    """
    a, b = [float(v) for v in num], [float(v) for v in den]
    if len(a) != len(b):
        raise ValueError(f"paired_ratio_ci needs as many num as den values, got {len(a)} and {len(b)}")
    if not a or sum(b) == 0:
        return (float("nan"), float("nan"), float("nan"))
    rng = random.Random(seed)
    n = len(a)
    ratios = []
    for _ in range(n_resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        d = sum(b[i] for i in idx)
        if d:
            ratios.append(sum(a[i] for i in idx) / d)
    return (sum(a) / sum(b), *_percentile_interval(ratios, confidence))
