"""A LlamaIndex response synthesizer that never re-splits node text (so every node links)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.indices.prompt_helper import PromptHelper
from llama_index.core.prompts.prompt_utils import get_biggest_prompt
from llama_index.core.response_synthesizers import CompactAndRefine
from llama_index.core.schema import NodeWithScore, QueryBundle

from ragpic.errors import ContextOverflowError
from ragpic.retriever_hooks.llamaindex import node_text

if TYPE_CHECKING:
    from ragpic.llm.llamaindex.llm import RagPicLLM

log = logging.getLogger("ragpic.llamaindex")

__all__ = ["ContextOverflowError", "RagPicSynthesizer", "make_query_engine"]


class RagPicSynthesizer(CompactAndRefine):
    """The ``compact`` synthesizer, but node texts are never re-split.

    LlamaIndex's ``compact`` mode re-splits the joined node texts whenever its token count
    (tiktoken by default) says they do not fit one prompt, and a re-split node no longer
    matches its cached KV. This synthesizer counts with the model's own tokenizer and, when
    the retrieved nodes do not fit the context window (minus the answer's tokens and the
    template), drops whole nodes, lowest score first (``on_overflow="drop"``, logged), or
    raises :class:`ContextOverflowError` (``on_overflow="error"``). The kept nodes stay in
    retrieval order and end up in one prompt, joined by ``"\\n\\n"`` exactly like ``compact``.
    ``response.source_nodes`` lists the nodes actually used.
    """

    def __init__(self, llm: RagPicLLM, *, on_overflow: str = "drop", prompt_helper: PromptHelper | None = None,
                 **kwargs: Any) -> None:
        if on_overflow not in ("drop", "error"):
            raise ValueError(f"on_overflow must be 'drop' or 'error', got {on_overflow!r}")
        prompt_helper = prompt_helper or PromptHelper.from_llm_metadata(llm.metadata, tokenizer=llm.token_ids)
        super().__init__(llm=llm, prompt_helper=prompt_helper, **kwargs)
        self._on_overflow = on_overflow
        self._count: Callable[[str], list] = llm.token_ids

    def _budget(self, query_str: str) -> int:
        """Tokens the joined node texts may take, as ``PromptHelper.repack`` computes it."""
        qa = self._text_qa_template.partial_format(query_str=query_str)
        refine = self._refine_template.partial_format(query_str=query_str)
        return self._prompt_helper._get_available_chunk_size(  # the number repack splits at
            get_biggest_prompt([qa, refine]), 1, padding=self._response_padding_size, llm=self._llm)

    def _fits(self, texts: Sequence[str], budget: int) -> bool:
        return len(self._count("\n\n".join(texts))) <= budget

    def fit_nodes(self, query: str | QueryBundle, nodes: Sequence[NodeWithScore]) -> list[NodeWithScore]:
        """The nodes that fit one prompt: all of them, or the best-scored ones in their order."""
        query_str = query.query_str if isinstance(query, QueryBundle) else query
        budget = self._budget(query_str)
        keep = list(nodes)
        if self._fits([node_text(n) for n in keep], budget):
            return keep
        total = len(self._count("\n\n".join(node_text(n) for n in keep)))
        if self._on_overflow == "error":
            raise ContextOverflowError(
                f"{len(keep)} retrieved nodes take {total} tokens but only {budget} fit the prompt "
                f"(context window {self._llm.metadata.context_window}, {self._llm.metadata.num_output} "
                f"for the answer): retrieve fewer nodes or use on_overflow='drop'")
        by_score = sorted(range(len(keep)), key=lambda i: (keep[i].score if keep[i].score is not None
                                                           else float("-inf"), -i))
        dropped = set()
        for i in by_score:
            if len(dropped) == len(keep) - 1:
                break
            dropped.add(i)
            if self._fits([node_text(n) for j, n in enumerate(keep) if j not in dropped], budget):
                break
        kept = [n for j, n in enumerate(keep) if j not in dropped]
        if not self._fits([node_text(n) for n in kept], budget):
            raise ContextOverflowError(
                f"the best retrieved node alone takes {len(self._count(node_text(kept[0])))} tokens but only "
                f"{budget} fit the prompt: use smaller chunks or a lower max_new_tokens")
        log.warning("dropped %d of %d retrieved nodes (lowest scores) to fit the context window "
                    "(%d tokens available, %d needed)", len(dropped), len(keep), budget, total)
        return kept

    def _make_compact_text_chunks(self, query_str: str, text_chunks: Sequence[str]) -> list[str]:
        texts = [c.strip() for c in text_chunks if c.strip()]
        budget = self._budget(query_str)
        joined = "\n\n".join(texts)
        if len(self._count(joined)) > budget:  # get_response called directly with too much text
            raise ContextOverflowError(
                f"the context texts take {len(self._count(joined))} tokens but only "
                f"{budget} fit the prompt; RagPicSynthesizer never re-splits them: pass fewer texts")
        return [joined]

    def synthesize(self, query, nodes: list[NodeWithScore], additional_source_nodes=None, **kwargs: Any):
        return super().synthesize(query, self.fit_nodes(query, nodes) if nodes else nodes,
                                  additional_source_nodes, **kwargs)

    async def asynthesize(self, query, nodes: list[NodeWithScore], additional_source_nodes=None, **kwargs: Any):
        return await super().asynthesize(query, self.fit_nodes(query, nodes) if nodes else nodes,
                                         additional_source_nodes, **kwargs)


_SYNTH_KWARGS = ("text_qa_template", "refine_template", "verbose", "output_cls", "streaming")


def make_query_engine(index: Any, llm: RagPicLLM, *, on_overflow: str = "drop", **kwargs: Any) -> Any:
    """``index.as_query_engine(llm=llm, ...)`` with a :class:`RagPicSynthesizer`, so node texts
    reach the prompt intact (every retrieved node can be linked from the store).

    ``text_qa_template``, ``refine_template``, ``streaming``, ``verbose`` and ``output_cls`` go
    to the synthesizer; everything else (``similarity_top_k``, ``node_postprocessors``, ...)
    to ``as_query_engine``.
    """
    synth_kw = {k: kwargs.pop(k) for k in _SYNTH_KWARGS if k in kwargs}
    synth = RagPicSynthesizer(llm, on_overflow=on_overflow, **synth_kw)
    return index.as_query_engine(llm=llm, response_synthesizer=synth, **kwargs)
