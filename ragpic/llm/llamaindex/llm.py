"""The LlamaIndex LLM over :class:`ragpic.RagPic` (the query engine that never re-splits nodes
is in :mod:`ragpic.llm.llamaindex.query_engine`; both are importable from ``ragpic.llm.llamaindex``).

::

    engine = RagPic(Config(store=kv_folder("idx")))
    llm = RagPicLLM(engine, max_new_tokens=128)
    query_engine = make_query_engine(index, llm, similarity_top_k=4)   # or index.as_query_engine(llm=llm)
    print(query_engine.query("Who ...?"))

Every call formats the messages with the model's chat template, finds the retrieved
nodes' exact texts in it (retrieval hints, see :mod:`ragpic.retriever_hooks.llamaindex`),
loads their KV from the store and links; everything else in the prompt is computed. The
generation's statistics (``ttft_s``, ``chunks_loaded``, ...) are in each response's
``additional_kwargs`` and in :attr:`RagPicLLM.last_generation`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM

from ragpic.engine import check_engine
from ragpic.errors import ContextOverflowError
from ragpic.retriever_hooks.llamaindex import hints_for, install_retrieval_hints

if TYPE_CHECKING:
    from ragpic.engine import Generation, GenerationStream, RagPic

log = logging.getLogger("ragpic.llamaindex")

__all__ = ["RagPicLLM"]

_END = object()


def _stats(g: "Generation", hints: Sequence[str] | None) -> dict[str, Any]:
    d = dataclasses.asdict(g)
    d.pop("text", None)
    d.pop("token_ids", None)
    d["hints"] = len(hints or ())  # retrieved node texts passed to the engine
    return d


class RagPicLLM(CustomLLM):
    """A LlamaIndex chat LLM that links cached chunk KV instead of prefilling it.

    Args:
        engine: the :class:`ragpic.RagPic` to generate with (model + KV store).
        max_new_tokens: tokens to generate per call (default: the engine's config).
        temperature, top_p: sampling (default: the engine's config; 0 = greedy).
        method: link method override (default: the engine's ``config.method``).
        use_hints: pass retrieved node texts to the engine (see
            :mod:`ragpic.retriever_hooks.llamaindex`); the prompt is searched for stored chunks
            either way. Creating an LLM adds ragpic's hint handler to LlamaIndex's root
            dispatcher if it has none yet (one handler however many LLMs exist).
        system_prompt: LlamaIndex's usual system prompt (added by ``predict`` and by
            :meth:`complete`).

    Per-call keyword overrides: ``max_new_tokens`` (or ``max_tokens``), ``temperature``,
    ``top_p``, ``top_k``, ``stop``, ``seed``, ``method``, ``hints``.
    """

    max_new_tokens: int = Field(default=256, gt=0, description="Tokens to generate per call.")
    temperature: float = Field(default=0.0, ge=0.0, description="0 is greedy decoding.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    method: str | None = Field(default=None, description="Link method; the engine's when None.")
    use_hints: bool = Field(default=True, description="Pass retrieved node texts to the engine.")
    model_name: str = Field(default="", description="The model's name.")

    _engine: Any = PrivateAttr()
    _last: Any = PrivateAttr(default=None)
    _last_hints: Any = PrivateAttr(default=None)

    def __init__(self, engine: "RagPic | None" = None, *, max_new_tokens: int | None = None,
                 temperature: float | None = None, top_p: float | None = None, method: str | None = None,
                 **kwargs: Any):
        engine = check_engine(engine, type(self).__name__)
        cfg = engine.config
        super().__init__(
            max_new_tokens=max_new_tokens if max_new_tokens is not None else cfg.max_new_tokens,
            temperature=temperature if temperature is not None else cfg.temperature,
            top_p=top_p if top_p is not None else cfg.top_p,
            method=method,
            model_name=kwargs.pop("model_name", None) or str(engine.lm.name),
            **kwargs,
        )
        self._engine = engine
        install_retrieval_hints()

    @classmethod
    def class_name(cls) -> str:
        return "RagPicLLM"

    # ----- facts ------------------------------------------------------------------------
    @property
    def engine(self) -> "RagPic":
        return self._engine

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=self._engine.context_window,
            num_output=self.max_new_tokens,
            is_chat_model=True,
            is_function_calling_model=False,
            model_name=self.model_name,
        )

    @property
    def last_generation(self) -> "Generation | None":
        """The :class:`ragpic.engine.Generation` of the latest call (filled as it streams)."""
        return self._last

    @property
    def last_hints(self) -> tuple[str, ...]:
        """The retrieval hints (node texts) passed to the engine on the latest call."""
        return tuple(self._last_hints or ())

    def token_ids(self, text: str) -> list[int]:
        """The model's token ids of ``text`` (no special tokens): LlamaIndex's ``tokenizer``."""
        return self._engine.lm.tokenizer(text, add_special_tokens=False)["input_ids"]

    # ----- the one code path ------------------------------------------------------------
    def _messages(self, messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
        out = []
        for m in messages:
            role = m.role.value if isinstance(m.role, MessageRole) else str(m.role)
            out.append({"role": role, "content": m.content or ""})
        return out

    def _prompt_messages(self, prompt: str) -> list[dict[str, str]]:
        system = self.system_prompt or self._engine.config.system_prompt
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]

    def _start(self, messages: list[dict[str, str]], kwargs: dict[str, Any],
               hints: Any) -> tuple["GenerationStream", tuple[str, ...]]:
        """Format, check the fit, link (the prompt's work happens here); return the stream and
        the hints used. ``hints`` is a tuple or :func:`hints_for` (resolved against the prompt)."""
        engine = self._engine
        max_new = kwargs.get("max_new_tokens") or kwargs.get("max_tokens") or self.max_new_tokens
        text = engine.format_chat(messages)
        if callable(hints):
            hints = hints(text)
        hints = tuple(hints or ())
        n = engine.count_tokens(text)
        if n + max_new > engine.context_window:
            raise ContextOverflowError(
                f"the prompt has {n} tokens and {max_new} are to be generated, but the model's context "
                f"window is {engine.context_window}: retrieve fewer or smaller nodes (make_query_engine "
                f"drops the lowest-scored nodes that do not fit) or lower max_new_tokens")
        stream = engine.stream(
            text, chat=False, hints=list(hints) if hints else None,
            method=kwargs.get("method") or self.method,
            max_new_tokens=max_new,
            temperature=kwargs.get("temperature", self.temperature),
            top_p=kwargs.get("top_p", self.top_p),
            top_k=kwargs.get("top_k"),
            stop=kwargs.get("stop"),
            seed=kwargs.get("seed"),
        )
        self._last, self._last_hints = stream.result, hints
        return stream, hints

    def _hints(self, kwargs: dict[str, Any]) -> Any:
        """Explicit ``hints=`` or, read now in the caller's context, the retrieval's."""
        if "hints" in kwargs:
            return tuple(kwargs.pop("hints") or ())
        return hints_for if self.use_hints else None

    def _run(self, messages: list[dict[str, str]], kwargs: dict[str, Any],
             hints) -> tuple["Generation", tuple[str, ...]]:
        stream, hints = self._start(messages, kwargs, hints)
        for _ in stream:
            pass
        return stream.result, hints

    # ----- completion -------------------------------------------------------------------
    def _complete(self, prompt: str, kwargs: dict[str, Any], hints) -> CompletionResponse:
        g, hints = self._run(self._prompt_messages(prompt), kwargs, hints)
        return CompletionResponse(text=g.text, additional_kwargs=_stats(g, hints))

    def _stream_complete(self, prompt: str, kwargs: dict[str, Any], hints) -> CompletionResponseGen:
        stream, hints = self._start(self._prompt_messages(prompt), kwargs, hints)

        def gen() -> CompletionResponseGen:
            text = ""
            for delta in stream:
                text += delta
                yield CompletionResponse(text=text, delta=delta, additional_kwargs=_stats(stream.result, hints))

        return gen()

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Answer ``prompt`` as one user turn (the answer only, never the prompt)."""
        return self._complete(prompt, kwargs, self._hints(kwargs))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        return self._stream_complete(prompt, kwargs, self._hints(kwargs))

    # ----- chat -------------------------------------------------------------------------
    def _chat(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any], hints) -> ChatResponse:
        g, hints = self._run(self._messages(messages), kwargs, hints)
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=g.text),
                            additional_kwargs=_stats(g, hints))

    def _stream_chat(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any], hints) -> ChatResponseGen:
        stream, hints = self._start(self._messages(messages), kwargs, hints)

        def gen() -> ChatResponseGen:
            text = ""
            for delta in stream:
                text += delta
                yield ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta=delta,
                                   additional_kwargs=_stats(stream.result, hints))

        return gen()

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._chat(messages, kwargs, self._hints(kwargs))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return self._stream_chat(messages, kwargs, self._hints(kwargs))

    # ----- async: the work runs in a worker thread, the event loop stays free ----------
    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return await asyncio.to_thread(self._complete, prompt, kwargs, self._hints(kwargs))

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False,
                               **kwargs: Any) -> CompletionResponseAsyncGen:
        sync_gen = await asyncio.to_thread(self._stream_complete, prompt, kwargs, self._hints(kwargs))
        return _athreaded(sync_gen)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await asyncio.to_thread(self._chat, messages, kwargs, self._hints(kwargs))

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        sync_gen = await asyncio.to_thread(self._stream_chat, messages, kwargs, self._hints(kwargs))
        return _athreaded(sync_gen)


async def _athreaded(sync_gen) -> AsyncIterator[Any]:
    """Drive a blocking generator from worker threads, one item per hop (each decode step
    runs off the event loop; abandoning the iterator stops generation)."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            item = await loop.run_in_executor(None, next, sync_gen, _END)
            if item is _END:
                return
            yield item
    finally:
        sync_gen.close()
