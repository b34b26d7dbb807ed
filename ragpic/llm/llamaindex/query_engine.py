"""A LlamaIndex response synthesizer that never re-splits node text (so every node links)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.indices.prompt_helper import PromptHelper
from llama_index.core.prompts.prompt_utils import get_biggest_prompt
from llama_index.core.response_synthesizers import CompactAndRefine
from llama_index.core.schema import NodeWithScore, QueryBundle

from ragpic.errors import ConfigError, ContextOverflowError
from ragpic.retriever_hooks.llamaindex import node_text

if TYPE_CHECKING:
    from ragpic.llm.llamaindex.llm import RagPicLLM

log = logging.getLogger("ragpic.llamaindex")

__all__ = ["ContextOverflowError", "RagPicSynthesizer", "WholeNodePromptHelper", "make_query_engine"]


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
        prompt_helper = prompt_helper or WholeNodePromptHelper.from_llm_metadata(llm.metadata,
                                                                                 tokenizer=llm.token_ids)
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


_SYNTH_KWARGS = ("text_qa_template", "refine_template", "summary_template", "verbose", "output_cls", "streaming",
                 "use_async")
# Modes whose every LLM prompt is built from retrieved node texts; each keeps them whole here.
WHOLE_NODE_MODES = ("compact", "refine", "tree_summarize", "accumulate", "compact_accumulate")
_REFUSED = {
    "simple_summarize": "it truncates node text to fit one prompt (and llama-index-core 0.14 puts the nodes' "
                        "list repr in the prompt): use 'compact', the same single prompt with whole nodes",
    "generation": "it puts no retrieved text in the prompt, so there is nothing to link: call the LLM directly",
    "no_text": "it never calls the LLM: use index.as_retriever() to get the nodes",
    "context_only": "it never calls the LLM: use index.as_retriever() to get the nodes",
}


class WholeNodePromptHelper(PromptHelper):
    """A ``PromptHelper`` whose ``repack`` never cuts a text: texts are packed whole, in order,
    joined by ``"\n\n"`` as LlamaIndex joins them, into as few prompts as fit (counted with
    the model's tokenizer). So every LLM prompt of refine, tree_summarize or accumulate holds
    whole node texts, each one a stored chunk. A text that alone does not fit raises."""

    def repack(self, prompt, text_chunks: Sequence[str], padding: int = 5, llm=None, tools=None) -> list[str]:
        # `padding` is a synthesizer's wish for answer room (refine asks 500 on its first pass);
        # groups respect it, but a text that only fits with the minimal padding goes alone
        # rather than being cut.
        soft = self._get_available_chunk_size(prompt, 1, padding=padding, llm=llm, tools=tools)
        hard = self._get_available_chunk_size(prompt, 1, padding=min(padding, 5), llm=llm, tools=tools)
        count = self._token_counter.get_string_tokens
        groups: list[list[str]] = []
        for text in (c.strip() for c in text_chunks if c.strip()):
            if count(text) > hard:
                raise ContextOverflowError(
                    f"a retrieved text of {count(text)} tokens does not fit the {hard} tokens a prompt has "
                    f"for context: use smaller chunks, a lower max_new_tokens or a larger context_window")
            if groups and count("\n\n".join([*groups[-1], text])) <= soft:
                groups[-1].append(text)
            else:
                groups.append([text])
        return ["\n\n".join(g) for g in groups]


def make_query_engine(index: Any, llm: RagPicLLM, *, response_mode: str = "compact", on_overflow: str = "drop",
                      **kwargs: Any) -> Any:
    """``index.as_query_engine(llm=llm, ...)`` whose synthesizer keeps node texts whole, so every
    retrieved node in a prompt can be linked from the store.

    ``response_mode``: ``compact`` (default) puts the nodes in one prompt through a
    :class:`RagPicSynthesizer` (whole nodes dropped, lowest score first, when they do not fit;
    ``on_overflow="error"`` raises instead); ``refine``, ``tree_summarize``, ``accumulate`` and
    ``compact_accumulate`` run LlamaIndex's own synthesizer with a :class:`WholeNodePromptHelper`.
    Other modes are refused with the mode to use. ``text_qa_template``, ``refine_template``,
    ``summary_template``, ``streaming``, ``verbose``, ``use_async`` and ``output_cls`` go to the
    synthesizer; everything else (``similarity_top_k``, ``node_postprocessors``, ...) to
    ``as_query_engine``.
    """
    from llama_index.core.response_synthesizers import get_response_synthesizer

    mode = str(getattr(response_mode, "value", response_mode))
    if mode in _REFUSED:
        raise ConfigError(f"make_query_engine cannot use response_mode={mode!r}: {_REFUSED[mode]}")
    if mode not in WHOLE_NODE_MODES:
        raise ConfigError(f"unknown response_mode {mode!r}: use one of {', '.join(WHOLE_NODE_MODES)}")
    synth_kw = {k: kwargs.pop(k) for k in _SYNTH_KWARGS if k in kwargs}
    if mode == "compact":
        synth = RagPicSynthesizer(llm, on_overflow=on_overflow, **synth_kw)
    else:
        helper = WholeNodePromptHelper.from_llm_metadata(llm.metadata, tokenizer=llm.token_ids)
        synth = get_response_synthesizer(llm=llm, response_mode=mode, prompt_helper=helper, **synth_kw)
    return index.as_query_engine(llm=llm, response_synthesizer=synth, **kwargs)
