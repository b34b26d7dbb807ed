"""Capacity on paper (``ragpic store plan``): bytes per token of stored KV, the bytes of a corpus,
how many chunks fit in a memory, and the hit rate of a hot set under Zipf popularity.

Bytes of one entry of ``T`` tokens, from a model's geometry ``L`` layers x ``H`` KV heads x
``D`` head_dim (:func:`payload_bytes`; the layout is
:func:`ragpic.cache.format.entry_header.payload_layout`, and the tests hold the two equal)::

    token ids          8 T                              (int64, every format)
    fp32 / bf16        2 L H T D x 4 / x 2              (keys and values as compiled)
    int8               2 L H T D + 2 x 2 L H T          (codes + one bf16 scale per row)
    int4               L H T D + 4 L H T + 4 L H ceil(T/64) D
                                                        (two codes a byte, bf16 scale+min per
                                                         value row and per 64-token key group)

plus the entry's frame: a 26-byte prefix and a JSON header holding the chunk text (its UTF-8
bytes) and some 300 bytes of fixed fields, measured from a real entry by :func:`entry_overhead`.

Hit rates: requests draw chunk ``i`` (by popularity rank, from 1) with probability
``i**-s / H(N, s)``, the workload of ``benchmarks/sim_eviction.py``. A hot set that keeps the
``k`` most popular chunks hits ``H(k, s) / H(N, s)`` (:func:`top_k_hit_rate`; the best any cache
of ``k`` entries does on independent requests); an LRU of ``k`` entries does less
(:func:`lru_hit_rate` simulates it). ``H`` is summed exactly up to 1000 terms, the rest by
Euler-Maclaurin (relative error < 1e-12), so N = 1e7 costs microseconds.

Stdlib only, but for the entry header reader (:func:`entry_overhead`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from ragpic.cache.tools.sizes import HotSet, format_bytes
from ragpic.cache.tools.zipf import lru_hit_rate, top_k_hit_rate

__all__ = ["KV_FORMATS", "Geometry", "Plan", "FormatRow", "HotRow", "EntryOverhead", "payload_bytes",
           "bytes_per_token", "entry_overhead", "jemalloc_size", "redis_entry_bytes", "make_plan", "format_plan"]

# format name -> (the dtype an entry's header names, the entry's quant): what `kv_quant` and the
# model dtype give. int8/int4 bytes do not depend on the dtype they stand for.
KV_FORMATS: dict[str, tuple[str, str]] = {
    "fp32": ("float32", "none"), "bf16": ("bfloat16", "none"), "int8": ("float32", "int8"),
    "int4": ("float32", "int4"),
}
INT4_GROUP = 64  # keys are quantized per channel in groups of 64 tokens (ragpic/cache/format/int4.py)
TOKEN_ID_BYTES = 8
LRU_MAX_CHUNKS = 20_000  # the LRU is simulated for corpora up to this many chunks


@dataclass(frozen=True, slots=True)
class Geometry:
    """What a model's stored KV is made of: ``layers`` x ``kv_heads`` x ``head_dim`` per token
    (keys and values each). ``name`` and ``source`` say whose and where the numbers were read."""

    layers: int
    kv_heads: int
    head_dim: int
    name: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        for what in ("layers", "kv_heads", "head_dim"):
            if not isinstance(getattr(self, what), int) or getattr(self, what) < 1:
                raise ValueError(f"{what} must be a positive integer, got {getattr(self, what)!r}")

    def describe(self) -> str:
        return f"{self.layers} layers x {self.kv_heads} KV heads x head_dim {self.head_dim}"


def _format(kv: str) -> tuple[str, str]:
    try:
        return KV_FORMATS[kv]
    except KeyError:
        raise ValueError(f"unknown KV format {kv!r}: one of {', '.join(KV_FORMATS)}") from None


def payload_bytes(g: Geometry, kv: str, tokens: int) -> int:
    """Payload bytes of one entry of ``tokens`` tokens of ``g``'s KV stored as ``kv`` (the formula)."""
    dtype, quant = _format(kv)
    rows = g.layers * g.kv_heads * tokens  # (layer, head, token) rows of head_dim values, keys and values each
    ids = TOKEN_ID_BYTES * tokens
    if quant == "none":
        return ids + 2 * rows * g.head_dim * (4 if dtype == "float32" else 2)
    if quant == "int8":
        return ids + 2 * rows * g.head_dim + 2 * 2 * rows
    if g.head_dim % 2:
        raise ValueError(f"int4 needs an even head_dim, got {g.head_dim}")
    groups = -(-tokens // INT4_GROUP)
    return ids + rows * g.head_dim + 2 * 2 * rows + 2 * 2 * g.layers * g.kv_heads * groups * g.head_dim


def bytes_per_token(g: Geometry, kv: str) -> float:
    """Payload bytes per token for chunks of a multiple of 64 tokens (int4's key groups full)."""
    return payload_bytes(g, kv, INT4_GROUP) / INT4_GROUP


@dataclass(frozen=True, slots=True)
class EntryOverhead:
    """A real entry's bytes, split: ``payload`` (the tensors), ``text`` (the chunk text's UTF-8 bytes
    in its header) and ``fixed`` (the prefix and every other header field: the frame)."""

    total: int
    payload: int
    text: int
    tokens: int

    @property
    def fixed(self) -> int:
        return self.total - self.payload - self.text


def entry_overhead(entry: bytes) -> EntryOverhead:
    """Split the bytes of an entry written by the store's encoder (:func:`ragpic.cache.format.entry.encode`).

    Raises:
        CorruptEntry: ``entry`` is not an intact entry.
    """
    from ragpic.cache.format.entry_header import verify  # torch: only when an entry is measured

    header, start = verify(entry)
    return EntryOverhead(total=len(entry), payload=len(entry) - start,
                         text=len(header["text"].encode("utf-8")), tokens=header["num_tokens"])


# ----- Redis ------------------------------------------------------------------------------
# Measured on redis-server 7.0.15 (jemalloc 5.3.0) through ChunkStore + RedisBackend, 200 entries
# (docs/SCALING.md, Capacity): MEMORY USAGE of the payload key is its value's jemalloc size class
# + 120 B; the meta key 120 B; the catalog row the text + ~115 B; the text index's rows ~280 B.
REDIS_KEY_BYTES = 120 + 120 + 115 + 280


def jemalloc_size(n: int) -> int:
    """The allocation jemalloc makes for ``n`` bytes: past 4 KiB, four size classes a power of two
    (``n`` rounded up to a multiple of an eighth of the next power of two: up to +25%)."""
    if n <= 4096:
        return max(8, -(-n // 16) * 16)  # small classes are finer; an entry is never this small
    step = 1 << ((n - 1).bit_length() - 3)
    return -(-n // step) * step


def redis_entry_bytes(entry_bytes: int, text_bytes: int) -> int:
    """Memory one entry takes in Redis (counted against ``maxmemory``): its payload key's
    allocation, its meta key, its catalog row (which holds the text again) and its anchor rows."""
    return jemalloc_size(entry_bytes) + REDIS_KEY_BYTES + text_bytes


# ----- the plan ---------------------------------------------------------------------------
@dataclass(slots=True)
class FormatRow:
    kv: str
    bytes_per_token: float  # payload, chunks of a multiple of 64 tokens
    entry_payload: int  # one entry of the plan's chunk_tokens
    entry_bytes: int  # payload + frame + text: what a store keeps per entry
    entry_bytes_per_token: float
    frame_bytes: int | None  # fixed header bytes, measured from a real entry (None: not measured)
    measured_tokens: int | None
    corpus_bytes: int
    held_bytes: int  # what the memory holds an entry in: the entry, or Redis's allocation and keys
    chunks_in_memory: int | None


@dataclass(slots=True)
class HotRow:
    hot: str
    kv: str | None  # None: the same chunks whatever the format (a count or a fraction)
    chunks: int
    fraction: float
    top_k: dict[str, float]  # zipf s (as text) -> static top-k hit rate
    lru: dict[str, float] | None


@dataclass(slots=True)
class Plan:
    geometry: Geometry
    chunks: int
    chunk_tokens: int
    text_bytes: int
    memory: int | None
    replicas: int
    store_bytes_per_entry: int
    redis: bool
    formats: list[FormatRow] = field(default_factory=list)
    hot: list[HotRow] = field(default_factory=list)
    zipf: list[float] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def make_plan(geometry: Geometry, *, chunks: int, chunk_tokens: int, formats: Sequence[str] = tuple(KV_FORMATS),
              memory: int | None = None, hot: Sequence[HotSet] = (), zipf: Sequence[float] = (1.0,),
              measured: Mapping[str, EntryOverhead] | None = None, chars_per_token: float = 4.0,
              replicas: int = 0, store_bytes_per_entry: int = 0, redis: bool = False,
              lru_max: int = LRU_MAX_CHUNKS, lru_requests: int | None = None) -> Plan:
    """The capacity of ``chunks`` chunks of ``chunk_tokens`` tokens of ``geometry``'s KV.

    ``measured[kv]`` is a real entry of that format split by :func:`entry_overhead`: its frame is
    added to every entry (without it, only the payload and the text are counted). The chunk text
    is ``chars_per_token`` UTF-8 bytes a token. ``memory`` holds ``memory / (1 + replicas)`` of
    distinct entries, each taking ``store_bytes_per_entry`` more than the entry (a store's keys and
    catalog row), or, with ``redis``, what Redis takes for it (:func:`redis_entry_bytes`). The LRU
    is simulated when ``chunks <= lru_max``.
    """
    if chunks < 1 or chunk_tokens < 1:
        raise ValueError("chunks and chunk_tokens must be >= 1")
    measured = measured or {}
    text = int(round(chars_per_token * chunk_tokens))
    plan = Plan(geometry, chunks, chunk_tokens, text, memory, replicas, store_bytes_per_entry, redis, zipf=list(zipf))
    for kv in formats:
        payload = payload_bytes(geometry, kv, chunk_tokens)
        m = measured.get(kv)
        frame = m.fixed if m is not None else None
        entry = payload + text + (frame or 0)
        held = (redis_entry_bytes(entry, text) if redis else entry) + store_bytes_per_entry
        fits = None
        if memory is not None:
            fits = min(chunks, int(memory / (1 + replicas) // held))
        plan.formats.append(FormatRow(kv, bytes_per_token(geometry, kv), payload, entry, entry / chunk_tokens,
                                      frame, m.tokens if m else None, entry * chunks, held, fits))
    s_keys = [f"{s:g}" for s in zipf]
    simulate = chunks <= lru_max

    def row(label: str, kv: str | None, k: int) -> HotRow:
        top = {key: top_k_hit_rate(chunks, s, k) for key, s in zip(s_keys, zipf)}
        lru = {key: lru_hit_rate(chunks, s, k, lru_requests) for key, s in zip(s_keys, zipf)} if simulate else None
        return HotRow(label, kv, k, k / chunks, top, lru)

    for h in hot:
        if h.kind == "bytes":
            for f in plan.formats:
                plan.hot.append(row(h.text, f.kv, h.chunks(chunks, f.held_bytes)))
        else:
            plan.hot.append(row(h.text, None, h.chunks(chunks, 1)))
    return plan


def _n(x: float) -> str:
    return f"{x:,.0f}"


def format_plan(p: Plan) -> str:
    """The plan as a readable table."""
    g = p.geometry
    out = [f"model: {g.name or 'geometry'}: {g.describe()} ({g.source or 'given'})",
           f"corpus: {_n(p.chunks)} chunks of {_n(p.chunk_tokens)} tokens ({_n(p.chunks * p.chunk_tokens)} tokens; "
           f"chunk text ~{_n(p.text_bytes)} B an entry)"]
    if p.memory is not None:
        extra = f", {p.replicas} replica(s) each" if p.replicas else ""
        per = f", +{_n(p.store_bytes_per_entry)} B an entry" if p.store_bytes_per_entry else ""
        how = " in Redis (an entry: its jemalloc size class + keys + catalog row)" if p.redis else ""
        out.append(f"memory: {format_bytes(p.memory)}{how}{extra}{per}")
    out.append("")
    head = f"{'format':<7}{'B/token':>10}{'entry B/token':>15}{'entry':>11}{'frame B':>9}{'corpus':>11}"
    if p.memory is not None:
        head += f"{'held as':>11}{'fit in memory':>22}"
    out.append(head)
    for f in p.formats:
        frame = "-" if f.frame_bytes is None else _n(f.frame_bytes)
        line = (f"{f.kv:<7}{_n(f.bytes_per_token):>10}{f.entry_bytes_per_token:>15,.1f}"
                f"{format_bytes(f.entry_bytes):>11}{frame:>9}{format_bytes(f.corpus_bytes):>11}")
        if f.chunks_in_memory is not None:
            line += f"{format_bytes(f.held_bytes):>11}"
            line += f"{_n(f.chunks_in_memory):>13} ({f.chunks_in_memory / p.chunks:.1%})".rjust(22)
        out.append(line)
    measured = [f for f in p.formats if f.measured_tokens]
    out.append("B/token: KV payload (token ids included) per token, the formula; entry: payload + chunk text + "
               "frame, " + (f"the frame measured by encoding a {measured[0].measured_tokens}-token entry with the "
                            "store's encoder" if measured else "frame not measured"))
    if p.hot:
        out.append("")
        lru = p.hot[0].lru is not None
        width = 15 if lru else 9
        s_cols = "".join(f"{'s=' + k:>{width}}" for k in p.hot[0].top_k)
        out.append(f"hot set hit rate, Zipf(s) requests over {_n(p.chunks)} chunks: static top-k"
                   + (" / LRU simulated" if lru else f" (LRU simulated up to {_n(LRU_MAX_CHUNKS)} chunks)"))
        out.append(f"{'hot':<10}{'format':<8}{'chunks':>12}{'of corpus':>11}{s_cols}")
        for h in p.hot:
            cells = "".join((f"{h.top_k[k]:.3f} / {h.lru[k]:.3f}" if h.lru else f"{h.top_k[k]:.3f}").rjust(width)
                            for k in h.top_k)
            out.append(f"{h.hot:<10}{h.kv or 'any':<8}{_n(h.chunks):>12}{h.fraction:>11.2%}{cells}")
    return "\n".join(out)
