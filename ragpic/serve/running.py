"""The model side of one request: link it, pick each token, step many of them together.

:func:`begin` matches a job's prompt against the store (compiling misses) and plans its
link, which the scheduler runs in pieces (:class:`ragpic.core.link.ChunkedLink`);
:func:`start` then picks its first token from the link's logits (:func:`admit`: all three
at once); :func:`step` runs one decode forward for a list of running requests: batched (:func:`ragpic.core.batch.batched_decode_step`) when the model
supports it and there are several, else the engine's own single-request step. Both run on
the scheduler thread, the only one that touches the model; :func:`begin` runs on a matcher thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ragpic.core.batch import BatchNotHonoured, batched_decode_step, supports_batching
from ragpic.core.decode import DecodeBuffers, Sampling, eos_token_ids, next_token
from ragpic.core.link import ChunkedLink
from ragpic.core.methods import parse_method
from ragpic.core.ops.linked_cache import LinkedCache, SlabPool
from ragpic.errors import ContextOverflowError
from ragpic.engine.generation import Generation, MatchStats
from ragpic.serve.detok import Detokenizer
from ragpic.serve.job import GenJob

__all__ = ["Linking", "Running", "admit", "begin", "start", "step"]


@dataclass(slots=True)
class Running:
    """A linked request being decoded.

    Attributes:
        cache: its linked cache (prompt rows filled; one row per generated token follows).
        pos: position of the token to feed next (``prompt_len + generated - 1``).
        token: the id to feed at ``pos`` (the last one emitted).
        steps: decode forwards done for it (index into ``bufs``).
        link_rows: prompt rows its link forwarded (``qr``: a row of both passes twice).
    """

    job: GenJob
    cache: LinkedCache
    params: Sampling
    gen: torch.Generator | None
    detok: Detokenizer
    result: Generation
    bufs: DecodeBuffers
    pos: int
    token: int = -1
    steps: int = 0
    done: bool = False
    link_rows: int = 0  # prompt rows the link forwarded (qr: both passes)


def _text(engine, job: GenJob) -> str:
    if job.messages is not None:
        return engine.format_chat(job.messages)
    return job.prompt


@dataclass(slots=True)
class Linking:
    """A request whose link runs in pieces between the running requests' decode steps."""

    job: GenJob
    params: Sampling
    stats: MatchStats
    link: ChunkedLink


def begin(engine, job: GenJob, pool: SlabPool, max_prompt_tokens: int, piece_rows: int | None = None, *,
          mine=None, compile_missing=None) -> Linking:
    """Match ``job``'s prompt against the store and plan its link (no model work: misses are
    compiled by ``compile_missing``, or by the engine at once; ``mine``: the store keys the
    caller may find, see :meth:`ragpic.RagPic.segments`).

    Raises what the engine raises for a bad request (``ConfigError``, ``LinkError``...) and
    :class:`ContextOverflowError` for a prompt over ``max_prompt_tokens``.
    """
    method = parse_method(job.method or engine.config.method)
    params = engine.sampling(**job.sampling)
    segs, stats = engine.segments(_text(engine, job), job.hints, method, mine=mine, compile_missing=compile_missing)
    n = sum(s.num_tokens for s in segs)
    if n > max_prompt_tokens:
        raise ContextOverflowError(f"the prompt has {n} tokens, more than this server's limit of "
                                   f"{max_prompt_tokens} (--max-prompt-tokens): send fewer or shorter chunks")
    return Linking(job, params, stats, ChunkedLink(engine.lm, segs, method, extra_capacity=params.max_new_tokens,
                                                   pool=pool, piece_rows=piece_rows))


def cached_tokens(prompt: int, link_rows: int, stats: MatchStats) -> int:
    """Prompt tokens whose KV came from the store **and** were not recomputed at link.

    Text outside chunks is always recomputed, so the recomputed rows inside chunks are
    ``link_rows - (prompt - chunk tokens)``, of which the store's chunks hold their share.
    Exact when no chunk of the prompt was compiled on a miss (then every chunk came from the
    store) and for every method but ``qr``, whose ``link_rows`` counts a row of both passes
    twice (its cached count is then a lower bound). ``cached + (prompt - cached) = prompt``:
    the rest is what the model computed for this request, at link or compiling a miss.
    """
    chunk_tokens = stats.cached_tokens + stats.compiled_tokens
    if chunk_tokens == 0:
        return 0
    in_chunks = min(chunk_tokens, max(0, link_rows - (prompt - chunk_tokens)))
    return max(0, stats.cached_tokens - round(in_chunks * stats.cached_tokens / chunk_tokens))


def start(engine, linking: Linking) -> Running:
    """The linked request, its first token emitted (``done`` when that ended it: EOS first...).

    Its ``result`` counts ``cached_tokens`` (:func:`cached_tokens`) and ``recomputed_tokens`` =
    the rest of the prompt, so the two add up to ``prompt_tokens``; ``link_rows`` on the run
    is what the link forwarded."""
    res, stats, job, params = linking.link.result, linking.stats, linking.job, linking.params
    cached = cached_tokens(res.num_tokens, res.recomputed, stats)
    result = Generation(method=linking.link.method.name, link_s=res.seconds, prompt_tokens=res.num_tokens,
                        recomputed_tokens=res.num_tokens - cached, chunks_matched=stats.matched,
                        chunks_loaded=stats.loaded, chunks_compiled=stats.compiled,
                        cached_tokens=cached, compiled_tokens=stats.compiled_tokens,
                        hints=stats.hinted, hints_found=stats.hints_found, model=engine.lm.name)
    gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
    run = Running(job, res.cache, params, gen, Detokenizer(engine.lm.tokenizer, params.stop), result,
                  DecodeBuffers(engine.lm, res.num_tokens, params.max_new_tokens), pos=res.num_tokens - 1,
                  link_rows=res.recomputed)
    job.send("linked", result)
    emit(engine, run, res.logits)
    return run


def admit(engine, job: GenJob, pool: SlabPool, max_prompt_tokens: int) -> Running:
    """Link ``job`` whole and emit its first token (:func:`begin`, the link, :func:`start`)."""
    linking = begin(engine, job, pool, max_prompt_tokens)
    while not linking.link.advance():
        pass
    return start(engine, linking)


def emit(engine, run: Running, logits: torch.Tensor) -> None:
    """Pick the next token from ``(V,)`` fp32 logits, send its text, and mark the run done on
    EOS, a stop string or ``max_new_tokens``."""
    tok, _ = next_token(logits, run.params, run.gen)
    first = not run.detok.ids
    if tok in eos_token_ids(engine.lm):
        return finish(run, "eos", first)
    text, stopped = run.detok.push(tok)
    if first:
        run.result.ttft_s = time.perf_counter() - run.job.arrived
    if text:
        run.job.send("delta", text)
    run.token, run.pos = tok, run.pos + 1
    if stopped:
        finish(run, "stop", False)
    elif len(run.detok.ids) >= run.params.max_new_tokens:
        finish(run, "length", False)


def finish(run: Running, reason: str, first: bool) -> None:
    if first:  # EOS straight away: the (empty) answer was known at that point
        run.result.ttft_s = time.perf_counter() - run.job.arrived
    if reason != "stop":
        tail = run.detok.flush()
        if tail:
            run.job.send("delta", tail)
    run.result.token_ids = list(run.detok.ids)
    run.result.finish_reason = reason
    run.done = True


def step(engine, runs: Sequence[Running], batch: bool = True) -> bool:
    """One decode forward for every run in ``runs``, then each one's next token.

    Batched when ``batch``, the model supports it and there are several; returns False when
    the model's attention turned out not to honour a batched step (the step was then taken
    one request at a time, exactly; the caller should stop asking for batches).
    """
    lm = engine.lm
    rows = None
    if batch and len(runs) > 1 and supports_batching(lm):
        try:
            logits = batched_decode_step(lm, [r.cache for r in runs], [r.token for r in runs], [r.pos for r in runs])
            rows = list(logits)
        except BatchNotHonoured:
            batch = False
    if rows is None:  # one request (the engine's own step), or a model whose attention cannot batch
        rows = [r.bufs.forward(lm, r.cache, r.pos - r.bufs.prompt_len, r.token) for r in runs]
    for r, row in zip(runs, rows):
        r.steps += 1
        emit(engine, r, row)
    return batch
