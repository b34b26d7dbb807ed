"""Server metrics in the Prometheus text exposition format (written by hand: no dependency).

One :class:`Metrics` per server, shared by the HTTP handlers and the scheduler thread (a lock
guards every update). ``render()`` is what ``GET /metrics`` returns. The turn log
(:meth:`Metrics.piece`, :meth:`Metrics.stepped`) keeps what the scheduler's policy promises
checkable from outside: the most pieces run between two decode steps, the largest pieces.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence

__all__ = ["Histogram", "Metrics"]

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LINK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class Histogram:
    """Cumulative buckets (``le``) plus sum and count, as Prometheus histograms are."""

    def __init__(self, buckets: Sequence[float]):
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def lines(self, name: str) -> list[str]:
        out, acc = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            acc += n
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            out.append(f'{name}_bucket{{le="{le}"}} {acc}')
        return out + [f"{name}_sum {self.sum:.6f}", f"{name}_count {acc}"]


_COUNTERS = {
    "requests": "completion requests answered, by outcome",
    "cache_hits": "chunks whose KV came from the store",
    "cache_misses": "chunks found in a prompt but not in the store",
    "chunks_compiled": "chunks compiled (on a miss or through /v1/context_cache)",
    "prompt_tokens": "prompt tokens linked",
    "cached_tokens": "prompt tokens whose KV came from the store and were not recomputed",
    "recomputed_tokens": "prompt tokens the model computed for the request (at link or compiling a miss)",
    "link_rows": "prompt rows the links forwarded (qr: a row of both passes twice)",
    "generated_tokens": "tokens generated",
    "decode_steps": "decode forwards (each serves a whole batch)",
    "pieces": "link and compile pieces run, by kind and whether requests were decoding",
    "compiles": "compiles (context-cache API and compile on a miss) ended, by outcome",
}
# The turn log's peaks (docs/SERVING.md, *The turn*): what the policy promises, checked live.
_PEAKS = {
    "pieces_between_decode_steps_max": "most pieces run between two decode steps while requests decoded (1)",
    "link_piece_rows_max": "largest link piece run (its planned rows: at most --link-piece)",
    "compile_piece_rows_max": "most rows one compile piece forwarded",
}


class Metrics:
    """Counters, histograms and live gauges of one server.

    Args:
        gauges: name -> (help, zero-argument function read at render time), e.g. queue depth.
    """

    def __init__(self, gauges: dict[str, tuple[str, Callable[[], float]]] | None = None):
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, int]] = {name: {} for name in _COUNTERS}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.link = Histogram(LINK_BUCKETS)
        self.batch = Histogram(BATCH_BUCKETS)
        self.gauges = dict(gauges or {})
        self._peaks = {name: 0 for name in _PEAKS}
        self._since_step = 0  # pieces since the last decode step

    def piece(self, kind: str, rows: int, decoding: bool) -> None:
        """A ``kind`` ("link", "compile") piece of ``rows`` ran; ``decoding``: requests were running
        (they wait for it: counted until their next decode step)."""
        with self._lock:
            name = f"{kind}_piece_rows_max"
            self._peaks[name] = max(self._peaks[name], rows)
            self._since_step = self._since_step + 1 if decoding else 0
        self.inc("pieces", kind=kind, decoding="yes" if decoding else "no")

    def stepped(self) -> None:
        """A decode step ran: the pieces since the previous one are what the streams waited for."""
        with self._lock:
            name = "pieces_between_decode_steps_max"
            self._peaks[name] = max(self._peaks[name], self._since_step)
            self._since_step = 0
        self.inc("decode_steps")

    def peak(self, name: str) -> int:
        with self._lock:
            return self._peaks[name]

    def inc(self, name: str, n: int = 1, **labels: str) -> None:
        key = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        with self._lock:
            self._counts[name][key] = self._counts[name].get(key, 0) + n

    def observe(self, hist: str, value: float) -> None:
        with self._lock:
            getattr(self, hist).observe(value)

    def count(self, name: str, **labels: str) -> int:
        key = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        with self._lock:
            return self._counts[name].get(key, 0)

    def render(self) -> str:
        """The exposition text (``text/plain; version=0.0.4``)."""
        out: list[str] = []
        with self._lock:
            for name, doc in _COUNTERS.items():
                out += [f"# HELP ragpic_{name}_total {doc}", f"# TYPE ragpic_{name}_total counter"]
                rows = self._counts[name] or {"": 0}
                out += [f"ragpic_{name}_total{{{k}}} {v}" if k else f"ragpic_{name}_total {v}" for k, v in rows.items()]
            for name, hist, doc in (("ttft_seconds", self.ttft, "time to first token, from arrival"),
                                    ("link_seconds", self.link, "link forward time per request"),
                                    ("decode_batch_size", self.batch, "requests served by one decode forward")):
                out += [f"# HELP ragpic_{name} {doc}", f"# TYPE ragpic_{name} histogram", *hist.lines(f"ragpic_{name}")]
            for name, doc in _PEAKS.items():
                out += [f"# HELP ragpic_{name} {doc}", f"# TYPE ragpic_{name} gauge",
                        f"ragpic_{name} {self._peaks[name]}"]
        for name, (doc, read) in self.gauges.items():
            out += [f"# HELP ragpic_{name} {doc}", f"# TYPE ragpic_{name} gauge", f"ragpic_{name} {read():g}"]
        return "\n".join(out) + "\n"
