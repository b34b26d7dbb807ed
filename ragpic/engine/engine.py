"""RagPic: the one object the framework integrations share.

text -> segments (cached chunks found by their exact text) -> KV from the store (compiled
on a miss) -> link -> decode. LlamaIndex and LangChain classes are thin layers over this.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from ragpic.config import Config
from ragpic.core.decode import Sampling
from ragpic.core.kv import ChunkKV
from ragpic.core.methods import Method, parse_method
from ragpic.core.model import LoadedModel, load_model
from ragpic.core.ops.attention import uses_banded_attention
from ragpic.core.ops.linked_cache import SlabPool
from ragpic.core.segments import Segment
from ragpic.checks import check_number, check_text
from ragpic.errors import ConfigError, ContextOverflowError, GenerationTimeout
from ragpic.engine.calibration import Choice, choose
from ragpic.engine.calibration_file import find_calibration
from ragpic.engine.compile_pipeline import text_jobs
from ragpic.engine.compile_plan import plan_compile
from ragpic.engine.generation import Generation, GenerationStream, MatchStats
from ragpic.engine.in_order import check_in_order, compile_in_order, context_ids
from ragpic.engine.lookup import segments_of, store_jobs
from ragpic.engine.plan_options import PlanOptions
from ragpic.engine.prefix import PrefixCache
from ragpic.engine.prompting import check_messages, format_chat
from ragpic.engine.request import LinkedRequest

__all__ = ["Generation", "GenerationStream", "RagPic"]

log = logging.getLogger("ragpic.engine")

Messages = Sequence[dict]


class RagPic:
    """Compile chunk KV once, link it into any prompt that contains those chunks.

    Args:
        config: settings (defaults: embedded SmolLM2, ``auto``, memory store).
        lm: an already loaded model (skips loading ``config.model``).
        store: an already opened :class:`ragpic.cache.ChunkStore` (skips ``config.store``).
    """

    def __init__(self, config: Config | None = None, *, lm: LoadedModel | None = None, store=None):
        from ragpic.cache import open_store

        self.config = config or Config()
        # Serialises model steps (a link, then each decoded token) across threads; held per
        # step, never across a suspended stream or a store call, so an abandoned stream or a
        # stalled store cannot block others and concurrent streams interleave token by token.
        self._step = threading.Lock()
        self._pool = SlabPool()  # linked-cache memory, reused from one request to the next
        self._auto: dict[bool, Choice] = {}  # what method="auto" resolved to, per chunks-behind, on first use
        self._head: list[int] | None = None  # compile_head_ids(), on first use
        self._auto_lock = threading.Lock()
        self.lm = lm or load_model(self.config.model, device=self.config.device, dtype=self.config.dtype,
                                   weights=self.config.weights, hold_dense=self.config.hold_dense)
        # the leading text's exact KV, from one link to the next (ARCHITECTURE §4.10)
        self.prefixes = PrefixCache(self.lm.fingerprint, self.config.prefix_cache_tokens)
        self.store = store or open_store(
            self.config.store,
            fingerprint=self.lm.fingerprint,
            memory_bytes=self.config.memory_cache_mb << 20,
            size_limit_bytes=int(self.config.store_size_limit_gb * (1 << 30)),
            quant=self.config.kv_quant,
            stats_interval_s=self.config.store_stats_interval_s,
        )

    def cache_pool(self, max_idle: int = 1) -> SlabPool:
        """Memory for linked caches, reused from one request to the next (a server's own pool,
        holding up to ``max_idle`` idle caches: one per batch slot)."""
        return SlabPool(max_idle=max_idle)

    # ----- tokens and templates -------------------------------------------------------
    @property
    def context_window(self) -> int:
        return self.lm.context_window

    def count_tokens(self, text: str) -> int:
        return len(self.lm.tokenizer(text, add_special_tokens=False)["input_ids"])

    def format_chat(self, messages: Messages, *, add_generation_prompt: bool = True) -> str:
        """Messages -> the model's chat-template text, ending with the assistant turn opener."""
        return format_chat(self.lm.tokenizer, messages, add_generation_prompt=add_generation_prompt)

    def count_chat_tokens(self, messages: Messages) -> int:
        """Tokens of ``messages`` in the model's chat template (no assistant opener added)."""
        return self.count_tokens(self.format_chat(check_messages(messages), add_generation_prompt=False))

    def format_prompt(self, prompt: str) -> str:
        """A completion prompt as one user turn (plus the configured system prompt)."""
        messages = [{"role": "system", "content": self.config.system_prompt}] if self.config.system_prompt else []
        return self.format_chat(messages + [{"role": "user", "content": prompt}])

    def chat_opening(self, text: str = "") -> list[int]:
        """Ids of what :meth:`format_prompt` puts before the user's prompt (the chat template's
        start and ``config.system_prompt``; nothing without a template) followed by ``text``,
        tokenized as one piece, as a prompt's leading text is: what entries compiled in order
        read first (``config.compile_head``, docs/ARCHITECTURE.md §1.3)."""
        mark = "\u2063ragpic\u2063"  # in no template: where the user's text starts
        formatted = self.format_prompt(text + mark)
        return context_ids(self.lm.tokenizer, [formatted[:formatted.index(mark)] if mark in formatted else text])

    def compile_head_ids(self) -> list[int]:
        """The ids ``config.compile_head`` names (empty when ``False``), computed once per engine."""
        if self._head is None:
            head = self.config.compile_head
            self._head = [] if head is False else self.chat_opening("" if head is True else head)
        return self._head

    # ----- compile --------------------------------------------------------------------
    def method_of(self, method: str | Method | None = None) -> Method:
        """The parsed link method: ``method``, else ``config.method`` (the public entry points'
        one place to parse a name; everything below takes a :class:`Method`). ``auto`` comes
        back as the recipe it resolved to (:meth:`auto_choice`)."""
        m = method if isinstance(method, Method) else parse_method(method or self.config.method)
        return self.auto_choice().method if m.kind == "auto" else m

    def auto_choice(self, behind: bool = False) -> Choice:
        """What ``auto`` links with on this model at ``config.fidelity``: resolved on first use
        from the user's own calibration, else the one shipped for the model, else the documented
        fallback (:mod:`ragpic.engine.calibration`), and logged once (WARNING when uncalibrated,
        else INFO). ``behind``: for a prompt that links most of its chunks from entries compiled
        behind the chunks before them (:func:`~ragpic.engine.calibration.choose`)."""
        with self._auto_lock:
            if behind not in self._auto:
                cal, where = find_calibration(self.lm.fingerprint, self.lm.source_sha256)
                choice = self._auto[behind] = choose(cal, self.config.fidelity, where=where,
                                                     probe_runs=uses_banded_attention(self.lm.model), behind=behind)
                log.log(logging.INFO if choice.calibrated else logging.WARNING, "%s", choice.reason)
            return self._auto[behind]

    def chunk_key(self, text: str, method: str | Method | None = None) -> str:
        from ragpic.cache import chunk_key

        return chunk_key(self.lm.fingerprint, text, self.method_of(method).recipe, self.lm.dtype)

    def compile(self, texts: Iterable[str], *, method: str | Method | None = None,
                progress: bool = False, in_order: bool = False, separator: str = "\n\n") -> int:
        """Compile and store the KV of every text not stored yet; return how many were compiled.

        ``texts`` must be exactly what will appear in prompts (a list: a bare ``str`` is
        refused). Texts shorter than ``config.min_chunk_tokens`` are skipped: they are never
        cached or matched (the rules: :mod:`ragpic.engine.compile_plan`). Shows a progress bar
        when ``progress``; a failing chunk raises :class:`~ragpic.errors.ChunkError` naming it.

        ``in_order``: ``texts`` are one document's chunks in order; each is also compiled behind
        the ``config.compile_behind`` texts before it, each followed by ``separator`` (what a
        prompt puts between two retrieved chunks: LlamaIndex's and LangChain's ``"\n\n"``). A
        prompt holding a chunk right after those chunks links that entry (docs/ARCHITECTURE.md
        §1.3); the count returned includes these entries.
        """
        m = self.method_of(method)
        if in_order:
            check_in_order(self, m, separator)
        plan = plan_compile(self, texts, m)
        at = plan.todo_at  # errors name a text by its first place in the caller's list
        store_jobs(self, text_jobs(self.lm.tokenizer, plan.todo, [f"texts[{i}]" for i in at], at), m,
                   progress=progress, strict=True)
        return len(plan.todo) + (compile_in_order(self, plan.texts, separator, progress=progress) if in_order else 0)

    def cacheable(self, text: str) -> bool:
        """Whether ``text`` is long enough to be a cached chunk (``config.min_chunk_tokens``)."""
        return self.count_tokens(text) >= self.config.min_chunk_tokens

    # ----- segments -------------------------------------------------------------------
    def segments(self, text: str, hints: Sequence[str] | None = None,
                 method: str | Method | None = None, *, mine: Callable[[str], bool] | None = None,
                 compile_missing: Callable[[list[tuple[str, str]], Method], dict[str, ChunkKV]] | None = None,
                 ) -> tuple[list[Segment], MatchStats]:
        """Split template-formatted prompt text into segments, loading (or compiling) chunk KV.

        ``hints`` are chunk texts expected in the prompt (e.g. retrieved nodes); without
        them (or when none is found) the store's catalog of chunk texts is searched.
        ``mine`` (a server's tenants): only store keys it accepts are found in the catalog or
        loaded; any other chunk is a miss, as if nobody had stored it. ``compile_missing``:
        compiles and stores ``[(key, text)]`` misses, ``key -> KV`` as a read of its entry
        returns it (default: here, at once; the server's scheduler compiles them in pieces
        between decode steps and encodes them on its model thread).
        """
        return segments_of(self, text, hints, self.method_of(method), mine, compile_missing)

    def close(self) -> None:
        """Close the store: this process's hits, misses and recompiles are added to its shared
        counters (``ragpic store stats``), then its files or connections are closed."""
        self.store.close()

    # ----- generate -------------------------------------------------------------------
    def sampling(self, **overrides) -> Sampling:
        base = dict(max_new_tokens=self.config.max_new_tokens, temperature=self.config.temperature,
                    top_p=self.config.top_p)
        base.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(base) - set(Sampling.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown sampling argument(s) {sorted(unknown)}: use "
                              f"{', '.join(Sampling.__dataclass_fields__)}")
        return Sampling(**base)  # validates each value (a single stop str is one stop string)

    def plan(self, prompt: str | Messages, *, hints: Sequence[str] | None = None,
             method: str | Method | None = None, chat: bool = True, arrived: float | None = None,
             options: PlanOptions | None = None, **sampling) -> LinkedRequest:
        """Match the prompt against the store (loading or compiling its chunks' KV) and plan its
        link: the :class:`~ragpic.engine.request.LinkedRequest` that :meth:`stream` and the
        server's scheduler then drive. No model work but compiles on a miss.

        Args: as :meth:`stream`, plus ``arrived`` (when the request arrived: ``ttft_s`` runs
        from it) and ``options``, what a server sets (:class:`~ragpic.engine.plan_options.PlanOptions`:
        the cache pool, link pieces, prompt limit, cache salt, visible keys, compiles of misses).
        """
        opts = PlanOptions() if options is None else options
        arrived = time.perf_counter() if arrived is None else arrived
        asked = method if isinstance(method, Method) else parse_method(method or self.config.method)
        m = self.method_of(asked)
        params = self.sampling(**sampling)
        if isinstance(prompt, str):
            check_text("prompt", prompt)
            text = self.format_prompt(prompt) if chat else prompt
        else:
            text = self.format_chat(check_messages(prompt))
        segs, stats = self.segments(text, hints, m, mine=opts.mine, compile_missing=opts.compile_missing)
        if asked.kind == "auto" and stats.behind and 2 * stats.behind >= stats.matched:
            # most chunks read the chunks before them: fewer recomputed rows keep the same share
            # of full's score (ARCHITECTURE §4.9); the segments are the same, only the link differs
            m = self.auto_choice(behind=True).method
        n = sum(s.num_tokens for s in segs)
        if opts.max_prompt_tokens is not None and n > opts.max_prompt_tokens:
            raise ContextOverflowError(f"the prompt has {n} tokens, more than this server's limit of "
                                       f"{opts.max_prompt_tokens} (--max-prompt-tokens): send fewer or shorter chunks")
        return LinkedRequest(self.lm, segs, m, params, stats=stats, pool=self._pool if opts.pool is None else opts.pool,
                             piece_rows=opts.piece_rows, arrived=arrived, model=self.lm.name,
                             prefixes=self.prefixes if self.config.prefix_cache_tokens else None,
                             cache_salt=opts.cache_salt)

    def stream(self, prompt: str | Messages, *, hints: Sequence[str] | None = None,
               method: str | Method | None = None, chat: bool = True, timeout: float | None = None,
               **sampling) -> GenerationStream:
        """Link the prompt and stream the answer.

        Args:
            prompt: a completion prompt (wrapped as a user turn when ``chat``), a list of
                ``{"role", "content"}`` messages, or raw text when ``chat=False``.
            hints: chunk texts expected in the prompt.
            method: overrides ``config.method`` for this call.
            timeout: seconds the whole call may take; past it the stream raises
                :class:`GenerationTimeout` (checked after the link and after each token).
            sampling: ``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop``, ``seed``.
        """
        t0 = time.perf_counter()
        if timeout is not None:
            check_number("timeout", timeout, "a number of seconds > 0", lambda v: v > 0)
        # Store lookups (and compiles on a miss) run outside the step lock: a slow or stalled
        # store delays this request only, never the other streams' tokens.
        req = self.plan(prompt, hints=hints, method=method, chat=chat, arrived=t0, **sampling)
        try:
            with self._step:
                first = req.link().start()
        except BaseException:
            req.release()
            raise
        return GenerationStream(self._deltas(req, first, None if timeout is None else t0 + timeout), req.result)

    def generate(self, prompt: str | Messages, **kwargs) -> Generation:
        """Like :meth:`stream`, but returns the finished :class:`Generation`."""
        s = self.stream(prompt, **kwargs)
        for _ in s:
            pass
        return s.result

    def _deltas(self, req: LinkedRequest, first: str, deadline: float | None) -> Iterator[str]:
        """The request's text, one step (under the step lock) per token."""
        try:
            text = first
            while True:
                if deadline is not None and time.perf_counter() > deadline:
                    raise GenerationTimeout(
                        f"the call ran past its timeout of {deadline - req.arrived:g} s after "
                        f"{max(0, req.decoder.count - 1)} of up to {req.sampling.max_new_tokens} tokens: raise "
                        f"timeout or lower max_new_tokens")
                yield text
                if req.done:
                    return
                with self._step:
                    text = req.step()
        finally:  # finished, failed or abandoned: the next request reuses the cache's memory
            req.release()

