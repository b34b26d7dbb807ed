"""``ragpic bench``: link TTFT of every method vs context length, with FLOP limits and memory.

For each context length ``T`` the prompt is ``T - query_tokens`` tokens of haystack text
(the Paul Graham essays, or any text) cut into ``chunk_tokens``-token cached chunks,
followed by ``query_tokens`` tokens of uncached query. Every method links that same token
sequence; repeats are interleaved (the method order rotates each repeat) and medians are
reported, so background load hits every method alike. As in the engine, every method's
linked cache is written into memory reused from the previous link (a :class:`SlabPool`), so
no method pays the kernel's first-touch page faults on a fresh few-hundred-MB tensor.

``flop_limit_ratio`` is FLOPs(full prefill) / FLOPs(the method's link), counted from the
model config (docs/ARCHITECTURE.md §5): per layer and recomputed token,
``2 x (linear params of the layer)`` plus ``4 x heads x head_dim x (p + 1)`` for causal
attention at position ``p``; plus the LM head for the one last token. It is the speed-up a
method would get if every FLOP ran at the same rate; the measured ratio shows how close the
code comes.

``peak_mem_mb`` is the peak of memory allocated *by the link step* above what was live
before it (the model and the compiled chunks are not counted): ``torch.cuda.max_memory_allocated``
on CUDA; on the CPU, the tensor allocation timeline of ``torch.profiler`` (profile_memory):
every tensor allocated through PyTorch's allocator during the step, kernel temporaries
included, but not memory that oneDNN/BLAS obtain from malloc themselves. The profiled pass
is separate from the timed ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ragpic.core.model import LoadedModel
from ragpic.core.ops.linked_cache import SlabPool  # a type only: new_pool() makes one
from ragpic.core.segments import Segment
from ragpic.engine.offline import layer_rows, link_only, new_pool, prompt_ids, prompt_segments, request

from ragpic.eval import scoring
from ragpic.eval.answer import answer_row_fields, time_answer
from ragpic.eval.data import load_haystack
from ragpic.eval.plots import plot_bench
from ragpic.eval.variants import compile_for, method_of, normalize_methods, variant_key

__all__ = ["format_table", "method_flops", "plot_bench", "run_bench"]

DEFAULT_METHODS = ("full", "naive", "legolink-0", "legolink-16", "cacheblend-15")
# A reference prefill outside ragpic, timed beside the methods: seconds of one prefill of the
# ids (benchmarks/bench_peers.py's plain transformers and llama.cpp)
Peer = Callable[[Sequence[int]], float]
QUERY_TEXT = "\n\nQuestion: what is the one idea that connects all of these essays, and why does it matter? "


# ----------------------------------------------------------------------------- FLOPs
def _cfg_sizes(lm: LoadedModel) -> dict:
    cfg = lm.model.config
    h = int(cfg.hidden_size)
    nh = int(cfg.num_attention_heads)
    hd = int(lm.head_dim)
    kv = int(lm.num_kv_heads)
    inter = int(getattr(cfg, "intermediate_size", 4 * h))
    linear = h * nh * hd + 2 * h * kv * hd + nh * hd * h + 3 * h * inter  # q, k, v, o + gated MLP
    return {"linear_params": linear, "attn_width": nh * hd, "hidden": h, "vocab": int(cfg.vocab_size),
            "layers": lm.num_layers}


def link_flops(lm: LoadedModel, positions_per_layer: Sequence[tuple[int, float]]) -> float:
    """FLOPs of a forward where layer ``l`` runs ``count_l`` tokens whose causal key counts sum to ``kv_l``.

    Args:
        positions_per_layer: one ``(count, sum of (p + 1))`` per layer; fewer than the model's
            layers: a pass that stops early (``qp``'s probe), with no LM head.
    """
    s = _cfg_sizes(lm)
    total = 2.0 * s["hidden"] * s["vocab"] if len(positions_per_layer) >= s["layers"] else 0.0  # LM head, last token
    for count, kv_sum in positions_per_layer:
        total += 2.0 * s["linear_params"] * count + 4.0 * s["attn_width"] * kv_sum
    return total


def method_flops(lm: LoadedModel, segments: Sequence[Segment], method: str) -> float:
    """FLOP count of linking ``segments`` with ``method`` (causal attention counted exactly).

    For ``cacheblend-r``, ``qr-r`` and ``qp-r`` the selected tokens depend on the data; the count
    assumes they are spread evenly over the chunk tokens (so their attention cost is ``r`` of
    the chunks'); ``qr`` adds its first pass (``legolink-k``) and the question's second forward,
    ``qp`` its probe pass (``legolink-k``'s rows through the first layers).
    Each method's rows per layer come from its strategy (:meth:`ragpic.core.link.Linker.layer_rows`).
    """
    return sum(link_flops(lm, rows) for rows in layer_rows(segments, method_of(method), lm.num_layers))


# ----------------------------------------------------------------------------- memory
def link_peak_memory_mb(lm: LoadedModel, segments: Sequence[Segment], method: str) -> tuple[float, str]:
    """(peak MB allocated by one link of ``method``, how it was measured)."""
    if lm.device.type == "cuda":
        torch.cuda.synchronize(lm.device)
        base = torch.cuda.memory_allocated(lm.device)
        torch.cuda.reset_peak_memory_stats(lm.device)
        req = link_only(lm, segments, method_of(method))
        peak = torch.cuda.max_memory_allocated(lm.device) - base
        del req
        return peak / 2**20, "cuda.max_memory_allocated"
    try:
        from torch.profiler import ProfilerActivity, profile
        from torch.profiler._memory_profiler import MemoryProfileTimeline
    except ImportError:  # pragma: no cover - very old or stripped torch
        return float("nan"), "unavailable"
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        req = link_only(lm, segments, method_of(method))
        del req
    cur = peak = 0
    for _, action, _, size in MemoryProfileTimeline(prof._memory_profile()).timeline:
        name = getattr(action, "name", str(action))
        if name == "CREATE":
            cur += size
        elif name == "DESTROY":
            cur -= size
        peak = max(peak, cur)
    return peak / 2**20, "torch.profiler allocation timeline (CPU)"


# ----------------------------------------------------------------------------- prompts
def bench_prompt(tokens: Sequence[int], query_ids: Sequence[int], context_tokens: int,
                 chunk_tokens: int) -> tuple[list[list[int]], list[int]]:
    """(chunk ids, query ids) of a ``context_tokens``-token prompt cut from ``tokens``."""
    body = context_tokens - len(query_ids)
    if body < 1:
        raise ValueError(f"context of {context_tokens} tokens leaves no room beside {len(query_ids)} query tokens")
    src = list(tokens)
    while len(src) < body:
        src += list(tokens)
    body_ids = src[:body]
    return [body_ids[i:i + chunk_tokens] for i in range(0, body, chunk_tokens)], list(query_ids)


def query_ids(tokenizer, n: int) -> list[int]:
    ids = tokenizer(QUERY_TEXT, add_special_tokens=False)["input_ids"]
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


# ----------------------------------------------------------------------------- bench
def _time_methods(lm: LoadedModel, seg_of: dict[str, list[Segment]], methods: list[str], repeats: int,
                  pool: SlabPool, peers: dict[str, Peer], answer_tokens: int = 0,
                  answers: dict | None = None) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Link seconds of every repeat per method and peer (the order rotates each repeat, so
    drifting background load hits every one alike), and tokens each recomputed. With
    ``answer_tokens``, each method's request also decodes its answer; ``answers[m]`` gathers
    ``(decode s, tokens)`` per repeat."""
    names = methods + list(peers)
    times: dict[str, list[float]] = {m: [] for m in names}
    recomputed = {}
    ids = prompt_ids(seg_of["full"])
    for rep in range(repeats):
        for m in names[rep % len(names):] + names[:rep % len(names)]:
            if m in peers:  # a whole prefill outside ragpic, on the same ids
                times[m].append(peers[m](ids))
                recomputed[m] = len(ids)
                continue
            if answer_tokens:
                req = request(lm, seg_of[m], method_of(m), answer_tokens, pool=pool).link()
                link_s, decode_s, n = time_answer(req)
                answers.setdefault(m, []).append((decode_s, n))
            else:
                req = link_only(lm, seg_of[m], method_of(m), pool=pool)  # the engine's request, linked
            times[m].append(req.linked.seconds)
            recomputed[m] = req.linked.recomputed
            req.release()
    return times, recomputed


def _rows_for_length(lm: LoadedModel, T: int, seg_of: dict[str, list[Segment]], methods: list[str], times: dict,
                     recomputed: dict, chunks: int, measure_memory: bool) -> tuple[list[dict], str | None]:
    """One result row per method at context length ``T`` (and how peak memory was measured)."""
    full_flops = method_flops(lm, seg_of["full"], "full")
    medians = {m: scoring.median(v) for m, v in times.items()}
    rows, mem_how = [], None
    for m in times:
        mem = float("nan")
        if measure_memory and m in methods:
            mem, mem_how = link_peak_memory_mb(lm, seg_of[m], m)
        fl = method_flops(lm, seg_of[m], m) if m in methods else full_flops  # a peer prefills every token
        rows.append({
            "context_tokens": T, "method": m, "ttft_median_s": medians[m],
            "ratio_vs_full": medians["full"] / medians[m] if medians[m] > 0 else float("nan"),
            "flop_limit_ratio": full_flops / fl, "peak_mem_mb": mem, "ttft_s": times[m],
            "recomputed_tokens": recomputed[m], "gflops": fl / 1e9, "chunks": chunks,
        })
    return rows, mem_how


def _bench_methods(methods: Sequence[str] | str | None, k: int) -> list[str]:
    """Canonical names; a bare ``legolink`` (and the default ``legolink-16``) takes ``k``."""
    raw = methods if methods is not None else [m if m != "legolink-16" else f"legolink-{k}" for m in DEFAULT_METHODS]
    if isinstance(raw, str):
        raw = [m for m in raw.split(",") if m.strip()]
    return normalize_methods([f"legolink-{k}" if m.strip().lower() == "legolink" else m for m in raw])


def run_bench(lm: LoadedModel, *, text: str | None = None, haystack_dir: str | Path | None = None,
              context_tokens: Sequence[int] = (1024, 2048, 4096, 8192), chunk_tokens: int = 512, k: int = 16,
              query_tokens: int = 32, repeats: int = 5, methods: Sequence[str] | str | None = None,
              measure_memory: bool = True, progress: Callable[[str], None] | None = None,
              peers: dict[str, Peer] | None = None, answer_tokens: int = 0,
              answer_peer: Callable[[int], dict] | None = None) -> dict:
    """Time every method at every context length. Returns ``{"config", "rows"}``.

    ``legolink-K`` in ``methods`` is taken as given; ``k`` replaces the K of a bare
    ``legolink`` entry (the default list's ``legolink-16`` follows ``--k``). ``peers``
    (name -> :data:`Peer`) are timed in the same rotation, on the same ids as ``full``.
    ``answer_tokens``: also decode that many tokens per request (:mod:`ragpic.eval.answer`);
    ``answer_peer(T)`` gives a peer's answer row at ``T`` tokens (benchmarks/llamacpp_bench.py's
    llama-bench).
    """
    methods = _bench_methods(methods, k)
    peers = dict(peers or {})
    if peers and "full" not in methods:
        methods = ["full", *methods]  # peers prefill full's ids and are compared with it
    if text is None:
        if haystack_dir is None:
            raise ValueError("bench needs the haystack folder or a text")
        text = load_haystack(haystack_dir)
    tokens = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    q_ids = query_ids(lm.tokenizer, query_tokens)
    memo: dict = {}
    pool = new_pool()  # as in the engine: cache memory is reused from one link to the next
    rows, mem_how = [], None
    for li, T in enumerate(context_tokens):
        if T > lm.context_window:
            raise ValueError(f"context of {T} tokens exceeds the model's window of {lm.context_window}")
        chunks, q = bench_prompt(tokens, q_ids, T, chunk_tokens)
        kvs = compile_for(lm, chunks, methods, memo)
        segs = {r: prompt_segments(lm.tokenizer, "", kv_list, q) for r, kv_list in kvs.items()}
        seg_of = {m: segs[variant_key(m)] for m in methods}
        if li == 0:  # warm every code path once (allocator, kernels), untimed
            for m in methods:
                link_only(lm, seg_of[m], method_of(m), pool=pool).release()
            for run in peers.values():
                run(prompt_ids(seg_of["full"]))
        answers: dict = {}
        times, recomputed = _time_methods(lm, seg_of, methods, repeats, pool, peers, answer_tokens, answers)
        length_rows, mem_how = _rows_for_length(lm, T, seg_of, methods, times, recomputed, len(chunks),
                                                measure_memory)
        for r in length_rows:
            if r["method"] in answers:
                runs = answers[r["method"]]
                r.update(answer_row_fields(times[r["method"]], [d for d, _ in runs], [n for _, n in runs]))
        if answer_peer is not None:  # on full's ids, as every peer
            n_ids = len(prompt_ids(seg_of["full"]))
            length_rows.append({"context_tokens": n_ids, **answer_peer(n_ids)})
        rows += length_rows
        if progress:
            progress(f"{T} tokens: " + "  ".join(f"{r['method']} {r['ttft_median_s']:.3f}s" for r in length_rows))
        # keep only what the next (longer) prompt reuses: its full-size leading chunks
        keep = {(r, tuple(c)) for r in kvs for c in chunks[:-1]}
        for key in [key for key in memo if key not in keep]:
            del memo[key]
    return {"config": {"context_tokens": list(context_tokens), "chunk_tokens": chunk_tokens, "k": k,
                       "query_tokens": query_tokens, "repeats": repeats, "methods": methods,
                       "peers": list(peers), "model": lm.name,
                       "device": str(lm.device), "dtype": str(lm.dtype), "torch_threads": torch.get_num_threads(),
                       "peak_mem_method": mem_how, "answer_tokens": answer_tokens},
            "rows": rows}


def format_table(result: dict) -> str:
    if result["config"].get("answer_tokens"):
        return format_answer_table(result)
    head = f"{'ctx':>6} {'method':<15}{'ttft_s':>9}{'speedup':>9}{'flop_lim':>9}{'recomp':>8}{'peak_MB':>9}"
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        lines.append(f"{r['context_tokens']:>6} {r['method']:<15}{r['ttft_median_s']:>9.3f}{r['ratio_vs_full']:>8.1f}x"
                     f"{r['flop_limit_ratio']:>8.1f}x{r['recomputed_tokens']:>8}{r['peak_mem_mb']:>9.1f}")
    return "\n".join(lines)


def format_answer_table(result: dict) -> str:
    """The ``--answer-tokens`` table: TTFT, decode rate and the whole answer per method."""
    n = result["config"]["answer_tokens"]
    head = f"{'ctx':>6} {'method':<15}{'ttft_s':>9}{'decode_tok/s':>13}{f'answer{n}_s':>12}{'vs_full':>9}"
    lines = [head, "-" * len(head)]
    full = {r["context_tokens"]: r.get("answer_median_s") for r in result["rows"] if r["method"] == "full"}
    for r in result["rows"]:
        ref = full.get(r["context_tokens"]) or min(full.values(), default=None)
        ratio = ref / r["answer_median_s"] if ref and r.get("answer_median_s") else float("nan")
        lines.append(f"{r['context_tokens']:>6} {r['method']:<15}{r['ttft_median_s']:>9.3f}"
                     f"{r.get('decode_tok_s', float('nan')):>13.1f}{r.get('answer_median_s', float('nan')):>12.2f}"
                     f"{ratio:>8.1f}x")
    return "\n".join(lines)
