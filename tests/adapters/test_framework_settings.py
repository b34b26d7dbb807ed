"""Framework conventions on a tiny random model: every setting honoured or refused, token
counts from the model's tokenizer, usage with cache reads, and no silent cache miss."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")

from langchain_core.callbacks import BaseCallbackHandler  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, trim_messages  # noqa: E402

from ragpic import Config, RagPic  # noqa: E402
from ragpic.errors import ConfigError, GenerationTimeout  # noqa: E402
from ragpic.llm.langchain import ChatRagPic, RagPicLLM  # noqa: E402
from ragpic.llm.llamaindex import RagPicLLM as LlamaRagPicLLM  # noqa: E402
from tiny import tiny_lm  # noqa: E402

PASSAGE = "the quick brown fox jumps over the lazy dog near the park."


@pytest.fixture(scope="module")
def engine():
    lm = tiny_lm("llama", num_hidden_layers=2)
    lm.model.generation_config.eos_token_id = None  # random weights: always run to the limit
    e = RagPic(Config(store=None, max_new_tokens=7, method="legolink-16"), lm=lm)
    e.compile([PASSAGE])
    return e


class Tokens(BaseCallbackHandler):
    def __init__(self):
        self.tokens = []

    def on_llm_new_token(self, token, **kwargs):
        self.tokens.append(token)


@pytest.mark.parametrize("cls", [ChatRagPic, RagPicLLM])
def test_langchain_max_tokens_is_max_new_tokens_in_the_constructor_and_per_call(engine, cls):
    model = cls(engine=engine, max_tokens=5)
    assert model.max_new_tokens == 5
    prompts = [[HumanMessage("hello")]] if cls is ChatRagPic else ["hello"]

    def made(**kw):
        return model.generate(prompts, **kw).generations[0][0].generation_info["completion_tokens"]

    assert made() == 5  # not the engine's 7 (nor 256)
    assert made(max_tokens=3) == 3 and made(max_new_tokens=2) == 2  # per call, under either name


@pytest.mark.parametrize("cls", [ChatRagPic, RagPicLLM])
def test_langchain_model_streaming_timeout_and_unknown_settings(engine, cls):
    assert cls(engine=engine, model=engine.lm.name).model_name == engine.lm.name
    with pytest.raises(ConfigError, match="got model='gpt-4o' but its engine runs"):
        cls(engine=engine, model="gpt-4o")
    with pytest.raises(ConfigError, match=r"unknown argument\(s\) \['frobnicate'\]"):
        cls(engine=engine, frobnicate=1)
    with pytest.raises(ConfigError, match="got model='gpt-4o' but its engine runs"):
        cls(engine=engine).invoke("hello", model="gpt-4o")  # per call too
    rec = Tokens()
    cls(engine=engine, streaming=True).invoke("hello", config={"callbacks": [rec]})
    assert len(rec.tokens) >= 1  # invoke streamed through on_llm_new_token
    with pytest.raises(GenerationTimeout, match="ran past its timeout"):
        cls(engine=engine, timeout=1e-9).invoke("hello")


def test_langchain_counts_tokens_with_the_models_tokenizer(engine):
    chat = ChatRagPic(engine=engine)
    ids = engine.lm.tokenizer("hello world", add_special_tokens=False)["input_ids"]
    assert chat.get_token_ids("hello world") == ids and chat.get_num_tokens("hello world") == len(ids)
    msgs = [SystemMessage("answer briefly"), HumanMessage("the quick brown fox " * 5),
            AIMessage("the lazy dog " * 5), HumanMessage("question: what is it?")]
    n = chat.get_num_tokens_from_messages(msgs)
    template = engine.lm.tokenizer.apply_chat_template(
        [{"role": r, "content": m.content} for r, m in zip(["system", "user", "assistant", "user"], msgs)],
        tokenize=False)
    assert n == len(engine.lm.tokenizer(template, add_special_tokens=False)["input_ids"]) > 0
    kept = trim_messages(msgs, max_tokens=n // 2, token_counter=chat, strategy="last")
    assert 0 < len(kept) < len(msgs) and chat.get_num_tokens_from_messages(kept) <= n // 2


def test_langchain_usage_reports_cache_reads_and_the_model_name(engine):
    prompt = f"context: {PASSAGE} question: what?"
    engine.prefixes.clear()  # no template head kept from the tests before: the passage alone is cached
    msg = ChatRagPic(engine=engine).invoke(prompt)
    details = msg.usage_metadata["input_token_details"]
    # the passage's tokens whose stored KV the link kept: LegoLink-16 recomputes its first 16
    n = len(engine.lm.tokenizer(PASSAGE, add_special_tokens=False)["input_ids"]) - 16
    assert engine.config.method == "legolink-16"
    assert details["cache_read"] == n and details["cache_creation"] == 0
    assert msg.response_metadata["model_name"] == engine.lm.name != "ragpic"
    # asked again, the chat template's head before the passage is linked from the last link's rows too
    head = engine.count_tokens(engine.format_prompt(prompt).split(PASSAGE)[0])
    again = ChatRagPic(engine=engine).invoke(prompt).usage_metadata["input_token_details"]
    assert head > 8 and again["cache_read"] == n + head
    engine.prefixes.clear()
    result = RagPicLLM(engine=engine).generate([prompt])
    usage = result.llm_output["token_usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == n and usage["completion_tokens"] == 7
    assert result.llm_output["model_name"] == engine.lm.name


def test_hints_missing_from_the_prompt_are_a_warning_with_counts(engine, caplog):
    rewritten = PASSAGE.replace(" the lazy", "  the lazy")  # what a format_docs that reflows text does
    with caplog.at_level(logging.WARNING, logger="ragpic.engine"):
        g = engine.generate(f"context: {rewritten}\nquestion: what?", hints=[PASSAGE])
    assert (g.hints, g.hints_found, g.chunks_loaded) == (1, 0, 0)
    [record] = [r for r in caplog.records if "retrieval hints are in the prompt only in part" in r.message]
    assert "1 of 1 retrieval hints" in record.message
    assert ("its first 31 characters are in the prompt, then the hint has 'the lazy dog near th' where the "
            "prompt has ' the lazy dog near t'") in record.message
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ragpic.engine"):  # absent altogether: one refine step
        g = engine.generate("context: something else entirely\nquestion: what?", hints=[PASSAGE])
    assert (g.hints, g.hints_found) == (1, 0) and not caplog.records


def test_llamaindex_settings_are_honoured_or_refused(engine):
    llm = LlamaRagPicLLM(engine, context_window=512, num_output=4, timeout=30)
    assert (llm.metadata.context_window, llm.metadata.num_output, llm.max_new_tokens) == (512, 4, 4)
    assert LlamaRagPicLLM(engine, max_tokens=3).max_new_tokens == 3
    assert llm.complete("hello").additional_kwargs["chunks_matched"] == 0
    with pytest.raises(ConfigError, match="context_window=999999: the model's window is 1024"):
        LlamaRagPicLLM(engine, context_window=999_999)
    with pytest.raises(ConfigError, match="got model='gpt-4o'"):
        LlamaRagPicLLM(engine, model="gpt-4o")
    with pytest.raises(ConfigError, match="these all set the tokens to generate"):
        LlamaRagPicLLM(engine, max_tokens=3, num_output=5)
    with pytest.raises(ConfigError, match=r"unknown argument\(s\) \['frobnicate'\]"):
        LlamaRagPicLLM(engine, frobnicate=True)
    with pytest.raises(ConfigError, match=r"unknown argument\(s\) \['bogus'\]"):
        llm.complete("hello", bogus=1)
    with pytest.raises(GenerationTimeout):
        LlamaRagPicLLM(engine, timeout=1e-9).complete("hello")


def test_llamaindex_raw_usage_feeds_token_counting(engine):
    from llama_index.core.callbacks import CallbackManager, TokenCountingHandler

    llm = LlamaRagPicLLM(engine, max_new_tokens=5)
    counter = TokenCountingHandler()  # tiktoken by default: raw["usage"] must win over it
    llm.callback_manager = CallbackManager([counter])
    r = llm.complete(f"context: {PASSAGE} question: what?")
    g = llm.last_generation
    assert r.raw["usage"]["prompt_tokens"] == g.prompt_tokens and r.raw["model"] == engine.lm.name
    assert r.raw["usage"]["prompt_tokens_details"]["cached_tokens"] == g.cached_tokens > 0
    assert (counter.prompt_llm_token_count, counter.completion_llm_token_count) == (g.prompt_tokens, 5)
    assert llm.tokenizer("hello world") == engine.lm.tokenizer("hello world", add_special_tokens=False)["input_ids"]
    last = list(llm.stream_complete("hello"))[-1]
    assert last.raw["usage"]["completion_tokens"] == 5
