"""What the LangChain completion and chat classes share: fields, engine plumbing, call stats."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from ragpic.engine import check_engine
from ragpic.generation import Generation as RagGeneration
from ragpic.retriever_hooks.langchain import RetrievalHints

__all__ = ["generation_info"]

_SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p", "top_k", "seed")
ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "tool"}

def generation_info(gen: RagGeneration, hints: int = 0) -> dict[str, Any]:
    """A ragpic :class:`~ragpic.engine.Generation`'s stats as a plain dict (no text).

    ``hints`` is how many retrieved texts the callback handler passed for this call (0: the
    engine searched its whole catalog of stored chunks instead).
    """
    return {
        "finish_reason": gen.finish_reason,
        "method": gen.method,
        "ttft_s": gen.ttft_s,
        "link_s": gen.link_s,
        "prompt_tokens": gen.prompt_tokens,
        "completion_tokens": len(gen.token_ids),
        "recomputed_tokens": gen.recomputed_tokens,
        "chunks_matched": gen.chunks_matched,
        "chunks_loaded": gen.chunks_loaded,
        "chunks_compiled": gen.chunks_compiled,
        "hints": hints,
    }


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
    """Fields and engine plumbing shared by the completion and chat classes."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    engine: Any = Field(default=None, exclude=True)
    """The shared :class:`ragpic.RagPic` (required: ``engine=RagPic()`` for the embedded SmolLM2)."""
    method: str | None = None
    """Link method for this model (``None``: the engine's ``config.method``)."""
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] | None = None
    """Stop strings added to those of each call; the answer ends before the first one."""
    hints: RetrievalHints = Field(default_factory=RetrievalHints, exclude=True)
    """Callback handler to pass in the chain's config (``callbacks=[llm.hints]``)."""

    def __init__(self, **kwargs: Any):
        # Checked before pydantic runs, so the caller gets ragpic's ConfigError, not a
        # ValidationError, and no model is ever loaded implicitly.
        check_engine(kwargs.get("engine"), type(self).__name__)
        super().__init__(**kwargs)

    # -- call plumbing -------------------------------------------------------------------------
    def _params(self, stop: list[str] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        unknown = set(kwargs) - set(_SAMPLING_KEYS) - {"method"}
        if unknown:
            raise TypeError(f"unexpected arguments {sorted(unknown)}; known: method, {', '.join(_SAMPLING_KEYS)}")
        params: dict[str, Any] = {k: getattr(self, k) for k in _SAMPLING_KEYS}
        params["method"] = self.method
        params.update(kwargs)
        stops = list(dict.fromkeys([*(self.stop or ()), *(stop or ())]))
        if stops:
            params["stop"] = stops
        return {k: v for k, v in params.items() if v is not None}

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
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.engine.lm.name, "fingerprint": self.engine.lm.fingerprint,
                "method": self.method or self.engine.config.method,
                **{k: getattr(self, k) for k in _SAMPLING_KEYS if getattr(self, k) is not None}}
