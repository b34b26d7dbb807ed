"""LangChain completion LLM (``langchain_core.language_models.llms.LLM``) over a ragpic engine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.llms import LLM
from langchain_core.outputs import Generation, GenerationChunk, LLMResult

from ragpic.llm.langchain.base import _CONFIG, CallDone, RagPicBase
from ragpic.retriever_hooks.langchain import prompt_key

__all__ = ["RagPicLLM"]


class RagPicLLM(RagPicBase, LLM):
    """LangChain completion LLM over a shared :class:`ragpic.RagPic`.

    The prompt string is wrapped as one user turn of the model's chat template (set
    ``chat_template=False`` to feed it raw). Sampling fields default to the engine's config;
    any of them, and ``method``, can also be passed per call (``llm.invoke(p, method="full")``).
    ``generation_info`` carries each answer's link statistics and ``llm_output["token_usage"]``
    OpenAI-style counts, with ``prompt_tokens_details.cached_tokens``.
    """

    chat_template: bool = True
    """Wrap the prompt in the model's chat template (as a user message)."""

    model_config = _CONFIG

    @property
    def _llm_type(self) -> str:
        return "ragpic"

    @property
    def _ls_model_type(self) -> str:
        return "llm"

    def _call(self, prompt: str, stop: list[str] | None = None,
              run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> str:
        return self._run(prompt, prompt_key(prompt), stop, kwargs, self.chat_template).text

    def _one(self, prompt: str, stop: list[str] | None, run_manager: CallbackManagerForLLMRun | None,
             kwargs: dict[str, Any]) -> CallDone:
        """One prompt's answer; with ``streaming`` each piece also goes to ``on_llm_new_token``."""
        if not self.streaming:
            return self._run(prompt, prompt_key(prompt), stop, kwargs, self.chat_template)
        done = None
        for text, done in self._deltas(prompt, prompt_key(prompt), stop, kwargs, self.chat_template):
            if run_manager is not None and text:
                run_manager.on_llm_new_token(text, chunk=self._chunk(text, None))
        return done

    def _result(self, dones: list[CallDone]) -> LLMResult:
        usage = [d.gen.usage() for d in dones]
        total = {k: sum(u[k] for u in usage) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        total["prompt_tokens_details"] = {"cached_tokens": sum(d.gen.cached_tokens for d in dones)}
        return LLMResult(generations=[[Generation(text=d.text, generation_info=d.info())] for d in dones],
                         llm_output={"token_usage": total, "model_name": self.model_name})

    def _generate(self, prompts: list[str], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> LLMResult:
        return self._result([self._one(p, stop, run_manager, kwargs) for p in prompts])

    async def _agenerate(self, prompts: list[str], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> LLMResult:
        dones = []
        for p in prompts:
            done = None
            async for text, done in self._adeltas(p, prompt_key(p), stop, kwargs, self.chat_template):
                if self.streaming and run_manager is not None and text:
                    await run_manager.on_llm_new_token(text, chunk=self._chunk(text, None))
            dones.append(done)
        return self._result(dones)

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
