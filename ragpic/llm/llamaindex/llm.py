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
from collections.abc import Sequence
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

from ragpic.llm.engine_arg import check_engine
from ragpic.errors import ConfigError, ContextOverflowError
from ragpic.llm.llamaindex.responses import athreaded, chat_response, completion_response, stream_responses
from ragpic.retriever_hooks.llamaindex import hints_for, install_retrieval_hints

if TYPE_CHECKING:
    from ragpic.engine.engine import Generation, GenerationStream, RagPic

__all__ = ["RagPicLLM"]

_CALL_KEYS = ("max_new_tokens", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "method",
              "hints", "timeout", "model")


def _one_of(owner: str, **aliases: int | None) -> int | None:
    """The value given under any of several names (all given ones must agree)."""
    given = {k: v for k, v in aliases.items() if v is not None}
    if len(set(given.values())) > 1:
        raise ConfigError(f"{owner} got {given}: these all set the tokens to generate; pass one of them")
    return next(iter(given.values()), None)


class RagPicLLM(CustomLLM):
    """A LlamaIndex chat LLM that links cached chunk KV instead of prefilling it.

    Args:
        engine: the :class:`ragpic.RagPic` to generate with (model + KV store); required.
        max_new_tokens: tokens to generate per call (``max_tokens=`` and LlamaIndex's
            ``num_output=`` mean the same); default: the engine's config.
        temperature, top_p: sampling (default: the engine's config; 0 = greedy).
        method: link method override (default: the engine's ``config.method``).
        context_window: the window LlamaIndex plans prompts for (default and maximum: the
            model's); a smaller one makes query engines pack less per prompt.
        model, model_name: must name the engine's model if given (one engine, one model).
        timeout: seconds a call may take (``ragpic.errors.GenerationTimeout`` past it).
        use_hints: pass retrieved node texts to the engine (see
            :mod:`ragpic.retriever_hooks.llamaindex`); the prompt is searched for stored chunks
            either way. Creating an LLM adds ragpic's hint handler to LlamaIndex's root
            dispatcher if it has none yet (one handler however many LLMs exist).
        system_prompt: LlamaIndex's usual system prompt (added by ``predict`` and by
            :meth:`complete`).

    Per-call keyword overrides: ``max_new_tokens`` (or ``max_tokens``), ``temperature``,
    ``top_p``, ``top_k``, ``stop``, ``seed``, ``method``, ``hints``, ``timeout``. Responses carry
    ragpic's statistics in ``additional_kwargs`` and OpenAI-style usage in ``raw["usage"]``.
    """

    max_new_tokens: int = Field(default=256, gt=0, description="Tokens to generate per call.")
    temperature: float = Field(default=0.0, ge=0.0, description="0 is greedy decoding.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    method: str | None = Field(default=None, description="Link method; the engine's when None.")
    use_hints: bool = Field(default=True, description="Pass retrieved node texts to the engine.")
    model_name: str = Field(default="", description="The model's name.")
    context_window: int = Field(default=0, ge=0, description="Window query engines plan for (0: the model's).")
    timeout: float | None = Field(default=None, gt=0, description="Seconds a call may take.")

    _engine: Any = PrivateAttr()
    _last: Any = PrivateAttr(default=None)
    _last_hints: Any = PrivateAttr(default=None)

    def __init__(self, engine: "RagPic | None" = None, *, max_new_tokens: int | None = None,
                 max_tokens: int | None = None, num_output: int | None = None, temperature: float | None = None,
                 top_p: float | None = None, method: str | None = None, context_window: int | None = None,
                 model: str | None = None, model_name: str | None = None, **kwargs: Any):
        owner = type(self).__name__
        engine = check_engine(engine, owner)
        unknown = sorted(set(kwargs) - set(type(self).model_fields))
        if unknown:
            raise ConfigError(f"{owner} got unknown argument(s) {unknown}")
        name = model or model_name
        if name is not None and name != engine.lm.name:
            raise ConfigError(f"{owner} got model={name!r} but its engine runs {engine.lm.name!r}: omit it, or "
                              f"pass an engine that loads it: RagPic(Config(model={name!r}))")
        if context_window is not None and not 0 < context_window <= engine.context_window:
            raise ConfigError(f"{owner} got context_window={context_window}: the model's window is "
                              f"{engine.context_window}; pass at most that (or omit it)")
        cfg = engine.config
        new = _one_of(owner, max_new_tokens=max_new_tokens, max_tokens=max_tokens, num_output=num_output)
        super().__init__(
            max_new_tokens=new if new is not None else cfg.max_new_tokens,
            temperature=temperature if temperature is not None else cfg.temperature,
            top_p=top_p if top_p is not None else cfg.top_p,
            method=method, model_name=engine.lm.name,
            context_window=context_window or engine.context_window, **kwargs,
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
        return LLMMetadata(context_window=self.context_window, num_output=self.max_new_tokens, is_chat_model=True,
                           is_function_calling_model=False, model_name=self.model_name)

    @property
    def last_generation(self) -> "Generation | None":
        """The :class:`ragpic.engine.generation.Generation` of the latest call (filled as it streams)."""
        return self._last

    @property
    def last_hints(self) -> tuple[str, ...]:
        """The retrieval hints (node texts) passed to the engine on the latest call."""
        return tuple(self._last_hints or ())

    def token_ids(self, text: str) -> list[int]:
        """The model's token ids of ``text`` (no special tokens)."""
        return self._engine.lm.tokenizer(text, add_special_tokens=False)["input_ids"]

    @property
    def tokenizer(self):
        """LlamaIndex's tokenizer hook (text -> ids) for this model: give it to
        ``TokenCountingHandler(tokenizer=llm.tokenizer)``, ``PromptHelper`` or ``Settings.tokenizer``."""
        return self.token_ids

    # ----- the one code path ------------------------------------------------------------
    def _messages(self, messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
        return [{"role": m.role.value if isinstance(m.role, MessageRole) else str(m.role), "content": m.content or ""}
                for m in messages]

    def _prompt_messages(self, prompt: str) -> list[dict[str, str]]:
        system = self.system_prompt or self._engine.config.system_prompt
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]

    def _settings(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The engine's keyword arguments for one call (this LLM's settings, overridden per call)."""
        unknown = sorted(set(kwargs) - set(_CALL_KEYS))
        if unknown:
            raise ConfigError(f"unknown argument(s) {unknown} for RagPicLLM: use {', '.join(_CALL_KEYS)}")
        if kwargs.get("model") not in (None, self.model_name):
            raise ConfigError(f"model={kwargs['model']!r}, but this LLM's engine runs {self.model_name!r}")
        new = _one_of("RagPicLLM", max_new_tokens=kwargs.get("max_new_tokens"), max_tokens=kwargs.get("max_tokens"))
        return {"method": kwargs.get("method") or self.method, "max_new_tokens": new or self.max_new_tokens,
                "temperature": kwargs.get("temperature", self.temperature), "top_p": kwargs.get("top_p", self.top_p),
                "top_k": kwargs.get("top_k"), "stop": kwargs.get("stop"), "seed": kwargs.get("seed"),
                "timeout": kwargs.get("timeout", self.timeout)}

    def _start(self, messages: list[dict[str, str]], kwargs: dict[str, Any],
               hints: Any) -> tuple["GenerationStream", tuple[str, ...]]:
        """Format, check the fit, link (the prompt's work happens here); return the stream and
        the hints used. ``hints`` is a tuple or :func:`hints_for` (resolved against the prompt)."""
        engine, settings = self._engine, self._settings(kwargs)
        text = engine.format_chat(messages)
        hints = tuple((hints(text) if callable(hints) else hints) or ())
        n, max_new = engine.count_tokens(text), settings["max_new_tokens"]
        if n + max_new > self.context_window:
            raise ContextOverflowError(
                f"the prompt has {n} tokens and {max_new} are to be generated, but the context window is "
                f"{self.context_window}: retrieve fewer or smaller nodes (make_query_engine drops the "
                f"lowest-scored nodes that do not fit) or lower max_new_tokens")
        stream = engine.stream(text, chat=False, hints=list(hints) if hints else None, **settings)
        self._last, self._last_hints = stream.result, hints
        return stream, hints

    def _hints(self, kwargs: dict[str, Any]) -> Any:
        """Explicit ``hints=`` or, read now in the caller's context, the retrieval's."""
        if "hints" in kwargs:
            return tuple(kwargs.pop("hints") or ())
        return hints_for if self.use_hints else None

    def _run(self, messages: list[dict[str, str]], kwargs: dict[str, Any], hints) -> "Generation":
        stream, _ = self._start(messages, kwargs, hints)
        for _ in stream:
            pass
        return stream.result

    # ----- completion -------------------------------------------------------------------
    def _complete(self, prompt: str, kwargs: dict[str, Any], hints) -> CompletionResponse:
        return completion_response(self._run(self._prompt_messages(prompt), kwargs, hints))

    def _stream_complete(self, prompt: str, kwargs: dict[str, Any], hints) -> CompletionResponseGen:
        stream, _ = self._start(self._prompt_messages(prompt), kwargs, hints)
        return stream_responses(stream, completion_response)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Answer ``prompt`` as one user turn (the answer only, never the prompt)."""
        return self._complete(prompt, kwargs, self._hints(kwargs))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        return self._stream_complete(prompt, kwargs, self._hints(kwargs))

    # ----- chat -------------------------------------------------------------------------
    def _chat(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any], hints) -> ChatResponse:
        return chat_response(self._run(self._messages(messages), kwargs, hints))

    def _stream_chat(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any], hints) -> ChatResponseGen:
        stream, _ = self._start(self._messages(messages), kwargs, hints)
        return stream_responses(stream, chat_response)

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
        return athreaded(sync_gen)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await asyncio.to_thread(self._chat, messages, kwargs, self._hints(kwargs))

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        sync_gen = await asyncio.to_thread(self._stream_chat, messages, kwargs, self._hints(kwargs))
        return athreaded(sync_gen)
