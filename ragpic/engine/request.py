"""One prompt on its way to its answer: the request object every entry point runs.

:class:`LinkedRequest` is the pipeline of docs/ARCHITECTURE.md §1.1, once: made by
:meth:`ragpic.RagPic.plan` (segments matched, KV loaded or compiled, link planned) or, for the
evaluations, straight from segments; then

- :meth:`link_piece` / :meth:`link`: the link, in pieces between other requests' decode steps
  (the server's turns) or whole;
- :meth:`start`: the :class:`Generation` record is made (its counts computed here and nowhere
  else, :func:`token_counts`) and the first token is picked from the link's logits;
- :meth:`step`: one decode forward and the next token; :func:`step_many` steps a batch together;
- :meth:`run`: start and step to the end; :attr:`result` is the finished :class:`Generation`;
- :meth:`teacher_forced`: the logits of a given answer over the linked cache (evaluations).

``RagPic.stream``, the server's scheduler and ``ragpic eval`` / ``bench`` drive this object, so
an answer, its counts and its timings mean the same thing whichever way it was asked for.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from ragpic.core.decode import Decoder, Sampling
from ragpic.engine.detok import Detokenizer
from ragpic.core.runner import forward_rows, runner_for
from ragpic.core.link import ChunkedLink, LinkResult, linker_for
from ragpic.core.methods import Method
from ragpic.core.model import LoadedModel
from ragpic.core.ops.linked_cache import SlabPool
from ragpic.core.segments import Segment, segment_starts
from ragpic.engine.generation import Generation, MatchStats
from ragpic.engine.prefix import PrefixCache
from ragpic.errors import BatchNotHonoured

__all__ = ["LinkedRequest", "step_many", "token_counts"]


def token_counts(segments: Sequence[Segment], rows: torch.Tensor, fresh: frozenset[int] | set[int]) -> tuple[int, int]:
    """``(cached_tokens, recomputed_tokens)`` of a linked prompt (docs/ARCHITECTURE.md §1.2).

    ``rows``: ``(N,)`` bool, the positions the link wrote fresh; ``fresh``: indices of the
    chunk segments compiled for this request (not read from a store). ``recomputed`` is the
    number of distinct positions the link computed; ``cached`` the positions of stored chunks
    whose compiled KV the link kept (what OpenAI-style usage calls cached: prefill skipped).
    """
    cached = 0
    for i, (seg, a) in enumerate(zip(segments, segment_starts(segments))):
        if seg.is_chunk and i not in fresh:
            cached += seg.num_tokens - int(rows[a:a + seg.num_tokens].sum())
    return cached, int(rows.sum())


class LinkedRequest:
    """A prompt's segments, linked with one method and decoded with one sampling.

    Args:
        lm: the model.
        segments: the prompt in order (chunk segments carry compiled KV of ``lm``).
        method: the parsed link method.
        sampling: decoding settings (``max_new_tokens`` rows are reserved after the prompt).
        stats: how the chunks were found (None: every chunk segment was compiled ahead).
        pool: where the linked cache's memory comes from and goes back to.
        piece_rows: most recomputed rows per :meth:`link_piece` (None: the link is one piece).
        extra_rows: rows reserved beyond ``max_new_tokens`` (teacher forcing needs one more).
        arrived: ``time.perf_counter()`` when the request arrived: ``ttft_s`` runs from it.
        model: the model name the :class:`Generation` reports.
        prefixes: leading-text KV kept from earlier links (:class:`~ragpic.engine.prefix.PrefixCache`):
            the prompt's leading text is linked from it when it holds those ids, and this link's
            leading rows are kept in it otherwise (None: neither).
        cache_salt: the prefix entries this request may link and the one it keeps are those of
            this salt only (a server's namespace; :class:`~ragpic.engine.prefix.PrefixCache`).

    Raises what :class:`ragpic.core.link.ChunkedLink` raises for a prompt that cannot link
    (empty, over the window, KV of another model or recipe), before any model work.
    """

    def __init__(self, lm: LoadedModel, segments: Sequence[Segment], method: Method, sampling: Sampling, *,
                 stats: MatchStats | None = None, pool: SlabPool | None = None, piece_rows: int | None = None,
                 extra_rows: int = 0, arrived: float | None = None, model: str = "",
                 prefixes: PrefixCache | None = None, cache_salt: str = ""):
        self.lm, self.method, self.sampling, self.pool = lm, method, sampling, pool
        self.stats = stats if stats is not None else MatchStats(matched=sum(s.is_chunk for s in segments))
        self.prefixes, self.cache_salt = prefixes, cache_salt
        # in place of the leading text, not before it: segment indices (stats.fresh) still hold
        self.segments = list(segments) if prefixes is None else prefixes.apply(segments, linker_for(method), cache_salt)
        self.arrived = time.perf_counter() if arrived is None else arrived
        self.model = model or lm.name
        self.linker = ChunkedLink(lm, self.segments, method, extra_capacity=sampling.max_new_tokens + extra_rows,
                                  pool=pool, piece_rows=piece_rows)
        self.result: Generation | None = None
        self.decoder: Decoder | None = None
        self.detok: Detokenizer | None = None
        self.done = False

    # ----- what a scheduler reads -------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        """Prompt tokens."""
        return self.linker.num_tokens

    @property
    def kv_rows(self) -> int:
        """KV rows the request holds once linked: prompt + reserved decode rows."""
        return self.linker.num_tokens + self.linker.extra_capacity

    @property
    def linked(self) -> LinkResult | None:
        """The link's result once it is complete (None before)."""
        return self.linker.result

    @property
    def first_logits(self) -> torch.Tensor:
        """``(V,)`` fp32 logits of the last prompt token (after the link)."""
        return self._linked().logits.float().cpu()

    # ----- link --------------------------------------------------------------------------
    def link_piece(self) -> bool:
        """Run the link's next piece; True once the link is complete (its leading text's rows
        then kept in ``prefixes``, when given)."""
        was_done = self.linker.done
        done = self.linker.advance()
        if done and not was_done and self.prefixes is not None:
            self.prefixes.keep(self.segments, self.linker.result, self.cache_salt)
        return done

    def link(self) -> "LinkedRequest":
        """Run the whole (rest of the) link; returns ``self``."""
        while not self.link_piece():
            pass
        return self

    def _linked(self) -> LinkResult:
        if self.linker.result is None:
            raise RuntimeError("link the request first (link() or link_piece() until True)")
        return self.linker.result

    # ----- decode ------------------------------------------------------------------------
    def start(self) -> str:
        """Make the :class:`Generation` record and pick the first token; its text (maybe "")."""
        res = self._linked()
        cached, recomputed = token_counts(self.segments, res.rows, self.stats.fresh)
        s = self.stats
        self.result = Generation(
            method=self.method.name, link_s=res.seconds, prompt_tokens=res.num_tokens,
            recomputed_tokens=recomputed, link_rows=res.recomputed, chunks_matched=s.matched,
            chunks_loaded=s.loaded, chunks_compiled=s.compiled, chunks_behind=s.behind, cached_tokens=cached,
            compiled_tokens=s.compiled_tokens, hints=s.hinted, hints_found=s.hints_found, model=self.model)
        self.decoder = Decoder(self.lm, res.cache, res.num_tokens, self.sampling)
        self.detok = Detokenizer(self.lm.tokenizer, self.sampling.stop)
        self.result.token_ids = self.detok.ids  # grows as tokens come; a copy once finished
        return self.emit(res.logits)

    def step(self) -> str:
        """One single-row decode forward and the next token's text (maybe "")."""
        return self.emit(self.decoder.forward())

    def emit(self, logits: torch.Tensor) -> str:
        """Pick the next token from ``(V,)`` fp32 logits; its text. Ends the request on EOS, a
        stop string or ``max_new_tokens`` (:attr:`done`, ``result.finish_reason``)."""
        tok = self.decoder.pick(logits)
        if not self.detok.ids:  # the first token (or EOS straight away): the answer has started
            self.result.ttft_s = time.perf_counter() - self.arrived
        if tok is None:
            return self._finish("eos")
        text, stopped = self.detok.push(tok)
        self.result.text += text
        if stopped:
            return text + self._finish("stop")
        if self.decoder.exhausted:
            return text + self._finish("length")
        return text

    def _finish(self, reason: str) -> str:
        tail = "" if reason == "stop" else self.detok.flush()
        self.result.text += tail
        self.result.token_ids = list(self.detok.ids)
        self.result.finish_reason = reason
        self.done = True
        return tail

    def run(self) -> Generation:
        """Link (what is left of it), then decode to the end; the finished :class:`Generation`."""
        self.link()
        self.start()
        while not self.done:
            self.step()
        return self.result

    # ----- evaluations -------------------------------------------------------------------
    @torch.inference_mode()
    def teacher_forced(self, answer_ids: Sequence[int]) -> torch.Tensor:
        """``(A+1, V)`` fp32 on the CPU: the next-token logits at each of ``answer_ids`` and after them.

        Row 0 is the link's own last-token logits; rows 1..A come from one forward of the
        answer over the linked cache at positions ``n..n+A-1`` (it overwrites what decode wrote
        there). Needs ``A <= max_new_tokens + extra_rows``.
        """
        res = self._linked()
        rows = [res.logits.float()[None]]
        if len(answer_ids):
            n, a = res.num_tokens, len(answer_ids)
            pos = torch.arange(n, n + a, device=self.lm.device)
            ids = torch.as_tensor(list(answer_ids), dtype=torch.long, device=self.lm.device)
            rows.append(forward_rows(self.lm, res.cache, ids, pos, n + a, logits_to_keep=0,
                                     host_positions=torch.arange(n, n + a)).float())  # host bands: no sync
        return torch.cat(rows).cpu()

    # ----- memory ------------------------------------------------------------------------
    def release(self) -> None:
        """Give the cache's memory back to the pool (finished, failed or abandoned)."""
        self.linker.abandon()
        res = self.linker.result
        if res is not None and res.cache is not None and self.pool is not None:
            self.pool.release(res.cache)
            res.cache = None


def step_many(lm: LoadedModel, requests: Sequence[LinkedRequest], batch: bool = True) -> tuple[list[str], bool]:
    """One decode forward for every request in ``requests``, then each one's next token.

    Batched (one ``(B, 1)`` forward, :meth:`ragpic.core.runner.ModelRunner.decode`) when ``batch``,
    the model supports it and there are several; else each request's own :meth:`LinkedRequest.step`.
    Returns each request's new text and whether batching held (False: the model's attention
    does not honour a batched step; the step was taken one request at a time, exactly, and the
    caller should stop asking for batches).
    """
    runner = runner_for(lm)
    if batch and len(requests) > 1 and runner.batches:
        decs = [r.decoder for r in requests]
        try:
            ids = torch.tensor([d.token for d in decs], dtype=torch.long).to(lm.device)
            logits = runner.decode(ids, [d.pos for d in decs], [d.cache for d in decs])
        except BatchNotHonoured:
            batch = False
        else:
            return [r.emit(row) for r, row in zip(requests, logits)], True
    return [r.step() for r in requests], batch
