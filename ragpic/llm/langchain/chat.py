"""LangChain chat model (``BaseChatModel``) over a ragpic engine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from ragpic.errors import ConfigError
from ragpic.llm.langchain.base import _CONFIG, ROLES, CallDone, RagPicBase, usage_metadata
from ragpic.retriever_hooks.langchain import messages_key

__all__ = ["ChatRagPic"]


def _content_text(message: BaseMessage) -> str:
    return message.content if isinstance(message.content, str) else message.text


class ChatRagPic(RagPicBase, BaseChatModel):
    """LangChain chat model over a shared :class:`ragpic.RagPic`.

    Messages go through the model's chat template (roles: system, user, assistant, tool);
    ``config.system_prompt`` is put first when the messages bring no system message.
    ``usage_metadata`` counts the prompt tokens whose KV came from the store as
    ``input_token_details.cache_read``; ``response_metadata`` has the link statistics.
    """

    model_config = _CONFIG

    @property
    def _llm_type(self) -> str:
        return "ragpic-chat"

    def _messages(self, messages: Sequence[BaseMessage]) -> list[dict]:
        out = [{"role": getattr(m, "role", None) or ROLES.get(m.type, m.type), "content": _content_text(m)}
               for m in messages]
        system = self.engine.config.system_prompt
        if system and not any(m["role"] == "system" for m in out):
            out.insert(0, {"role": "system", "content": system})
        return out

    def get_num_tokens_from_messages(self, messages: list[BaseMessage], tools: Sequence | None = None) -> int:
        """Tokens of ``messages`` in the model's chat template, as this model would see them
        (``trim_messages(token_counter=chat)`` then counts real tokens). Tools are not supported."""
        if tools:
            raise ConfigError("ChatRagPic does not call tools: count messages without tools=")
        return self.engine.count_chat_tokens(self._messages(messages))

    @staticmethod
    def _meta(done: CallDone) -> dict[str, Any]:
        return {"response_metadata": {**done.info(), "model_provider": "ragpic"},
                "usage_metadata": usage_metadata(done.gen)}

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

    def _chunk(self, text: str, done: CallDone | None) -> ChatGenerationChunk:
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
