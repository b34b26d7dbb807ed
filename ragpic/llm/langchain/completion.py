"""LangChain completion LLM (``langchain_core.language_models.llms.LLM``) over a ragpic engine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.llms import LLM
from langchain_core.outputs import Generation, GenerationChunk, LLMResult

from ragpic.llm.langchain.base import CallDone, RagPicBase
from ragpic.retriever_hooks.langchain import prompt_key

__all__ = ["RagPicLLM"]


class RagPicLLM(RagPicBase, LLM):
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
    def _chunk(text: str, done: CallDone | None) -> GenerationChunk:
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
