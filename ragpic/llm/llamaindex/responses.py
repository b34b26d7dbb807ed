"""What a :class:`~ragpic.llm.llamaindex.RagPicLLM` call hands back to LlamaIndex: response
objects with ragpic's statistics in ``additional_kwargs`` and OpenAI-style usage in ``raw``
(which LlamaIndex's ``TokenCountingHandler`` reads), and async driving of blocking streams."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterator
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, CompletionResponse, MessageRole

from ragpic.engine.engine import GenerationStream
from ragpic.engine.generation import Generation

__all__ = ["athreaded", "chat_response", "completion_response", "stats", "stream_responses"]

_END = object()


def stats(g: Generation) -> dict[str, Any]:
    """The generation's statistics (everything but its text and ids), for ``additional_kwargs``."""
    d = dataclasses.asdict(g)
    d.pop("text", None)
    d.pop("token_ids", None)
    return d


def raw(g: Generation) -> dict[str, Any]:
    """``{"model", "usage"}`` with ``usage.prompt_tokens_details.cached_tokens``: the prompt
    tokens whose KV came from the store."""
    return {"model": g.model, "usage": g.usage()}


def completion_response(g: Generation, text: str | None = None, delta: str | None = None) -> CompletionResponse:
    return CompletionResponse(text=g.text if text is None else text, delta=delta, raw=raw(g),
                              additional_kwargs=stats(g))


def chat_response(g: Generation, text: str | None = None, delta: str | None = None) -> ChatResponse:
    message = ChatMessage(role=MessageRole.ASSISTANT, content=g.text if text is None else text)
    return ChatResponse(message=message, delta=delta, raw=raw(g), additional_kwargs=stats(g))


def stream_responses(stream: GenerationStream, make) -> Iterator[Any]:
    """One response per text delta (``make`` is :func:`completion_response` or
    :func:`chat_response`), each with the text so far; the last one has the final usage."""
    text = ""
    for delta in stream:
        text += delta
        yield make(stream.result, text, delta)


async def athreaded(sync_gen) -> AsyncIterator[Any]:
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
