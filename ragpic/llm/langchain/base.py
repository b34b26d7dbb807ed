"""What the LangChain completion and chat classes share: fields, engine plumbing, call stats."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from ragpic.engine.engine import RagPic
from ragpic.llm.engine_arg import check_engine
from ragpic.errors import ConfigError
from ragpic.engine.generation import Generation as RagGeneration
from ragpic.retriever_hooks.langchain import RetrievalHints

__all__ = ["RagPicBase", "check_model_name", "generation_info", "usage_metadata"]

_SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p", "top_k", "seed")
# extra="forbid": an argument LangChain users pass that ragpic does not know is an error, not a no-op
_CONFIG = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True, extra="forbid")
ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "tool"}

def generation_info(gen: RagGeneration, hints: int = 0) -> dict[str, Any]:
    """A ragpic :class:`~ragpic.engine.generation.Generation`'s stats as a plain dict (no text).

    ``hints`` is how many retrieved texts the callback handler passed for this call (0: the
    engine searched its whole catalog of stored chunks instead); ``hints_found`` how many of
    them the prompt contains (fewer means a cache miss, and a logged warning); ``chunks_behind``
    how many chunks linked an entry compiled behind the chunks before them (docs/ARCHITECTURE.md §1.3).
    """
    return {
        "finish_reason": gen.finish_reason,
        "model_name": gen.model,
        "method": gen.method,
        "ttft_s": gen.ttft_s,
        "link_s": gen.link_s,
        "prompt_tokens": gen.prompt_tokens,
        "completion_tokens": gen.completion_tokens,
        "recomputed_tokens": gen.recomputed_tokens,
        "cached_tokens": gen.cached_tokens,
        "compiled_tokens": gen.compiled_tokens,
        "chunks_matched": gen.chunks_matched,
        "chunks_loaded": gen.chunks_loaded,
        "chunks_compiled": gen.chunks_compiled,
        "chunks_behind": gen.chunks_behind,
        "hints": hints,
        "hints_found": gen.hints_found,
    }


def usage_metadata(gen: RagGeneration) -> dict[str, Any]:
    """LangChain ``UsageMetadata``: ``cache_read`` counts prompt tokens whose KV came from the
    store, ``cache_creation`` those in chunks compiled (and stored) during the call."""
    return {"input_tokens": gen.prompt_tokens, "output_tokens": gen.completion_tokens,
            "total_tokens": gen.prompt_tokens + gen.completion_tokens,
            "input_token_details": {"cache_read": gen.cached_tokens, "cache_creation": gen.compiled_tokens}}


def check_model_name(engine: RagPic, name: str | None, owner: str) -> None:
    """``name`` must be ``None`` or the engine's model: one engine runs one model."""
    if name is not None and name != engine.lm.name:
        raise ConfigError(f"{owner} got model={name!r} but its engine runs {engine.lm.name!r}: omit model=, or "
                          f"pass an engine that loads it: RagPic(Config(model={name!r}))")


class CallDone(NamedTuple):
    """The end of a call: the engine's generation and how many hints it was given."""

    gen: RagGeneration
    hints: int

    @property
    def text(self) -> str:
        return self.gen.text

    def info(self) -> dict[str, Any]:
        return generation_info(self.gen, self.hints)


class RagPicBase(BaseModel):
    """Fields and engine plumbing shared by the completion and chat classes.

    Every setting LangChain's conventions define is honoured or refused: unknown constructor
    arguments raise (no silent drops), ``model`` must name the engine's model, ``max_tokens``
    is ``max_new_tokens``, ``timeout`` bounds each call, ``streaming`` streams ``invoke``.
    """

    model_config = _CONFIG

    engine: Any = Field(default=None, exclude=True)
    """The shared :class:`ragpic.RagPic` (required: ``engine=RagPic()`` for the embedded SmolLM2)."""
    model_name: str | None = Field(default=None, alias="model")
    """The engine's model name (``model=`` works too); another name is refused: one engine runs one model."""
    method: str | None = None
    """Link method for this model (``None``: the engine's ``config.method``)."""
    max_new_tokens: int | None = Field(default=None, alias="max_tokens")
    """Tokens to generate at most (``max_tokens=`` works too); ``None``: the engine's config."""
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | None = None
    """Stop strings added to those of each call; the answer ends before the first one."""
    streaming: bool = False
    """``invoke`` streams internally, so callbacks see ``on_llm_new_token`` for each piece."""
    timeout: float | None = None
    """Seconds a call may take; past it the call raises ``ragpic.errors.GenerationTimeout``."""
    max_retries: int = 0
    """Accepted for code written against hosted models; a local engine has nothing to retry."""
    api_key: SecretStr | None = Field(default=None, exclude=True)
    """Accepted for code written against hosted models; a local engine needs no key."""
    hints: RetrievalHints = Field(default_factory=RetrievalHints, exclude=True)
    """Callback handler to pass in the chain's config (``callbacks=[llm.hints]``)."""

    def __init__(self, **kwargs: Any):
        # Checked before pydantic runs, so the caller gets ragpic's ConfigError, not a
        # ValidationError, and no model is ever loaded implicitly.
        owner = type(self).__name__
        engine = check_engine(kwargs.get("engine"), owner)
        fields = type(self).model_fields
        known = set(fields) | {f.alias for f in fields.values() if f.alias}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ConfigError(f"{owner} got unknown argument(s) {unknown}: it takes "
                              f"{', '.join(sorted(n for n in known if not n.startswith('_')))}")
        check_model_name(engine, kwargs.get("model", kwargs.get("model_name")), owner)
        super().__init__(**kwargs)
        if self.model_name is None:
            self.model_name = engine.lm.name

    # -- call plumbing -------------------------------------------------------------------------
    def _params(self, stop: list[str] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Engine keyword arguments for one call: the model's settings, overridden per call."""
        kwargs = dict(kwargs)
        if "max_tokens" in kwargs:
            kwargs["max_new_tokens"] = kwargs.pop("max_tokens")
        unknown = set(kwargs) - set(_SAMPLING_KEYS) - {"method", "model", "timeout"}
        if unknown:
            raise ConfigError(f"unknown argument(s) {sorted(unknown)} for {type(self).__name__}: use "
                              f"method, model, timeout, max_tokens, {', '.join(_SAMPLING_KEYS)}")
        check_model_name(self.engine, kwargs.pop("model", None), type(self).__name__)
        params: dict[str, Any] = {k: getattr(self, k) for k in _SAMPLING_KEYS}
        params["method"], params["timeout"] = self.method, self.timeout
        params.update(kwargs)
        stops = list(dict.fromkeys([*(self.stop or ()), *(stop or ())]))
        if stops:
            params["stop"] = stops
        return {k: v for k, v in params.items() if v is not None}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
        """LangSmith's standard parameters (tracing): provider, model, temperature, max tokens, stop."""
        cfg = self.engine.config
        params: dict[str, Any] = {
            "ls_provider": "ragpic", "ls_model_name": kwargs.get("model") or self.model_name,
            "ls_model_type": self._ls_model_type,
            "ls_temperature": kwargs.get("temperature", self.temperature if self.temperature is not None
                                         else cfg.temperature),
            "ls_max_tokens": kwargs.get("max_tokens", kwargs.get("max_new_tokens", self.max_new_tokens
                                                                  or cfg.max_new_tokens)),
        }
        stops = [*(self.stop or ()), *(stop or ())]
        if stops:
            params["ls_stop"] = stops
        return params

    def get_token_ids(self, text: str) -> list[int]:
        """The model's own token ids of ``text`` (LangChain's default would load GPT-2's)."""
        return self.engine.lm.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _deltas(self, prompt: str | list[dict], key: str, stop: list[str] | None, kwargs: dict[str, Any],
                chat: bool = True, cancel: threading.Event | None = None
                ) -> Iterator[tuple[str, CallDone | None]]:
        """``(text, None)`` per delta, then ``("", CallDone)`` once finished."""
        params = self._params(stop, kwargs)
        hints = self.hints.texts_for(key) or None  # this model's own handler, never another's
        # The engine serialises its own steps (link, then each token) across threads.
        stream = self.engine.stream(prompt, hints=hints, chat=chat, **params)  # links now
        for text in stream:
            yield text, None
            if cancel is not None and cancel.is_set():
                return
        yield "", CallDone(stream.result, len(hints or ()))

    async def _adeltas(self, *args: Any, **kwargs: Any) -> AsyncIterator[tuple[str, CallDone | None]]:
        """:meth:`_deltas` in a worker thread, handed over through an asyncio queue."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()

        def put(item: tuple[str, Any]) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop closed under us: nobody is listening any more
                cancel.set()

        def work() -> None:
            try:
                for item in self._deltas(*args, cancel=cancel, **kwargs):
                    put(("item", item))
                    if cancel.is_set():
                        return
            except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
                put(("error", e))
            else:
                put(("done", None))

        ctx = contextvars.copy_context()
        worker = loop.run_in_executor(None, ctx.run, work)
        try:
            while True:
                kind, value = await queue.get()
                if kind == "item":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    break
        finally:
            cancel.set()  # a consumer that stops early frees the engine after the current token
            if worker.done():
                worker.result()

    def _run(self, prompt: str | list[dict], key: str, stop: list[str] | None, kwargs: dict[str, Any],
             chat: bool = True) -> CallDone:
        done = None
        for _, done in self._deltas(prompt, key, stop, kwargs, chat):
            pass
        return done

    @property
    def _ls_model_type(self) -> str:
        return "chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.engine.lm.name, "fingerprint": self.engine.lm.fingerprint,
                "method": self.method or self.engine.config.method,
                **{k: getattr(self, k) for k in _SAMPLING_KEYS if getattr(self, k) is not None}}
