"""LangChain models backed by ragpic: :class:`RagPicLLM` (completion) and :class:`ChatRagPic` (chat).

Both are thin over one shared :class:`ragpic.RagPic`: the prompt LangChain builds is searched
for stored chunk texts (narrowed by :class:`RetrievalHints` when wired), their KV is loaded
and linked, and only the answer comes back (never the prompt). Usage::

    engine = RagPic(Config(store="index/kv"))
    llm = RagPicLLM(engine=engine, max_new_tokens=64)
    chain = ({"context": retriever | format_docs, "question": RunnablePassthrough()}
             | prompt | llm | StrOutputParser()).with_config(callbacks=[llm.hints])

Generation stats (TTFT, link time, tokens recomputed, chunks matched/loaded/compiled) land in
``generation_info`` (LLM) and ``response_metadata`` / ``usage_metadata`` (chat).

Async methods run the engine in a worker thread and stream through a queue, so the event
loop keeps running. Work on one engine is serialized step by step (one model, one tokenizer);
concurrent streams interleave token by token.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, NamedTuple

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.llms import LLM
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import (ChatGeneration, ChatGenerationChunk, ChatResult, Generation,
                                    GenerationChunk, LLMResult)
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ragpic.engine import Generation as RagGeneration
from ragpic.engine import RagPic
from ragpic.retriever_hooks.langchain import RetrievalHints, hints_for, messages_key, prompt_key

__all__ = ["ChatRagPic", "RagPicLLM", "generation_info"]

_SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p", "top_k", "seed")
_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "tool"}

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


class _Done(NamedTuple):
    """The end of a call: the engine's generation and how many hints it was given."""

    gen: RagGeneration
    hints: int

    @property
    def text(self) -> str:
        return self.gen.text

    def info(self) -> dict[str, Any]:
        return generation_info(self.gen, self.hints)


class _RagPicBase(BaseModel):
    """Fields and engine plumbing shared by the completion and chat classes."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    engine: Any = Field(default=None, exclude=True)
    """The shared :class:`ragpic.RagPic` (default: ``RagPic()``, the embedded SmolLM2)."""
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

    @model_validator(mode="after")
    def _default_engine(self):
        if self.engine is None:
            self.engine = RagPic()
        elif not isinstance(self.engine, RagPic):
            raise TypeError(f"engine must be a ragpic.RagPic, got {type(self.engine).__name__}")
        return self

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
                ) -> Iterator[tuple[str, _Done | None]]:
        """``(text, None)`` per delta, then ``("", _Done)`` once finished."""
        params = self._params(stop, kwargs)
        hints = hints_for(key) or None
        # The engine serialises its own steps (link, then each token) across threads.
        stream = self.engine.stream(prompt, hints=hints, chat=chat, **params)  # links now
        for text in stream:
            yield text, None
            if cancel is not None and cancel.is_set():
                return
        yield "", _Done(stream.result, len(hints or ()))

    async def _adeltas(self, *args: Any, **kwargs: Any) -> AsyncIterator[tuple[str, _Done | None]]:
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
             chat: bool = True) -> _Done:
        done = None
        for _, done in self._deltas(prompt, key, stop, kwargs, chat):
            pass
        return done

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.engine.lm.name, "fingerprint": self.engine.lm.fingerprint,
                "method": self.method or self.engine.config.method,
                **{k: getattr(self, k) for k in _SAMPLING_KEYS if getattr(self, k) is not None}}


class RagPicLLM(_RagPicBase, LLM):
    """LangChain completion LLM over a shared :class:`ragpic.RagPic`.

    The prompt string is wrapped as one user turn of the model's chat template (set
    ``chat_template=False`` to feed it raw). Sampling fields default to the engine's config;
    any of them, and ``method``, can also be passed per call (``llm.invoke(p, method="full")``).
    """

    chat_template: bool = True
    """Wrap the prompt in the model's chat template (as a user message)."""

    @property
    def _llm_type(self) -> str:
        return "ragpic"

    def _call(self, prompt: str, stop: list[str] | None = None,
              run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> str:
        return self._run(prompt, prompt_key(prompt), stop, kwargs, self.chat_template).text

    def _generate(self, prompts: list[str], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> LLMResult:
        gens = []
        for p in prompts:
            g = self._run(p, prompt_key(p), stop, kwargs, self.chat_template)
            gens.append([Generation(text=g.text, generation_info=g.info())])
        return LLMResult(generations=gens)

    async def _agenerate(self, prompts: list[str], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> LLMResult:
        gens = []
        for p in prompts:
            g = None
            async for _, g in self._adeltas(p, prompt_key(p), stop, kwargs, self.chat_template):
                pass
            gens.append([Generation(text=g.text, generation_info=g.info())])
        return LLMResult(generations=gens)

    @staticmethod
    def _chunk(text: str, done: _Done | None) -> GenerationChunk:
        return GenerationChunk(text=text, generation_info=done.info() if done else None)

    def _stream(self, prompt: str, stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> Iterator[GenerationChunk]:
        for text, done in self._deltas(prompt, prompt_key(prompt), stop, kwargs, self.chat_template):
            chunk = self._chunk(text, done)
            if run_manager is not None and text:
                run_manager.on_llm_new_token(text, chunk=chunk)
            yield chunk

    async def _astream(self, prompt: str, stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[GenerationChunk]:
        async for text, done in self._adeltas(prompt, prompt_key(prompt), stop, kwargs, self.chat_template):
            chunk = self._chunk(text, done)
            if run_manager is not None and text:
                await run_manager.on_llm_new_token(text, chunk=chunk)
            yield chunk


def _content_text(message: BaseMessage) -> str:
    return message.content if isinstance(message.content, str) else message.text


class ChatRagPic(_RagPicBase, BaseChatModel):
    """LangChain chat model over a shared :class:`ragpic.RagPic`.

    Messages go through the model's chat template (roles: system, user, assistant, tool);
    ``config.system_prompt`` is put first when the messages bring no system message.
    """

    @property
    def _llm_type(self) -> str:
        return "ragpic-chat"

    def _messages(self, messages: Sequence[BaseMessage]) -> list[dict]:
        out = [{"role": getattr(m, "role", None) or _ROLES.get(m.type, m.type), "content": _content_text(m)}
               for m in messages]
        system = self.engine.config.system_prompt
        if system and not any(m["role"] == "system" for m in out):
            out.insert(0, {"role": "system", "content": system})
        return out

    @staticmethod
    def _meta(done: _Done) -> dict[str, Any]:
        gen, info = done.gen, done.info()
        usage = {"input_tokens": gen.prompt_tokens, "output_tokens": len(gen.token_ids),
                 "total_tokens": gen.prompt_tokens + len(gen.token_ids)}
        return {"response_metadata": {**info, "model_name": "ragpic"}, "usage_metadata": usage}

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        done = self._run(self._messages(messages), messages_key(messages), stop, kwargs)
        meta = self._meta(done)
        msg = AIMessage(content=done.text, **meta)
        return ChatResult(generations=[ChatGeneration(message=msg, generation_info=meta["response_metadata"])])

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        done = None
        async for _, done in self._adeltas(self._messages(messages), messages_key(messages), stop, kwargs):
            pass
        meta = self._meta(done)
        msg = AIMessage(content=done.text, **meta)
        return ChatResult(generations=[ChatGeneration(message=msg, generation_info=meta["response_metadata"])])

    def _chunk(self, text: str, done: _Done | None) -> ChatGenerationChunk:
        if done is None:
            return ChatGenerationChunk(message=AIMessageChunk(content=text))
        return ChatGenerationChunk(message=AIMessageChunk(content="", chunk_position="last", **self._meta(done)))

    # BaseChatModel calls run_manager.on_llm_new_token for each chunk itself.
    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        for text, done in self._deltas(self._messages(messages), messages_key(messages), stop, kwargs):
            yield self._chunk(text, done)

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        async for text, done in self._adeltas(self._messages(messages), messages_key(messages), stop, kwargs):
            yield self._chunk(text, done)
