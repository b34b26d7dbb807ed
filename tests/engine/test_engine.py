"""The RagPic facade on a tiny random model: store hits, compile on miss, methods agree."""

from __future__ import annotations

import pytest

from ragpic import Config, RagPic
from ragpic.errors import ChunkError
from tiny import tiny_lm

PASSAGES = [
    "the quick brown fox jumps over the lazy dog near the park.",
    "a needle hides in the haystack near dolores park.",
    "answer: eat a sandwich and sit in the sun.",
]


def _prompt(passages):
    return "passages:\n" + "\n\n".join(passages) + "\n\nquestion: what is the best thing to do?"


@pytest.fixture
def engine(tmp_path):
    lm = tiny_lm("llama", num_hidden_layers=3)
    lm.model.generation_config.eos_token_id = None
    return RagPic(Config(store=str(tmp_path / "kv"), max_new_tokens=8), lm=lm)


def test_compiled_chunks_are_store_hits_at_query_time(engine):
    assert engine.compile(PASSAGES) == 3
    assert engine.compile(PASSAGES) == 0  # already stored
    engine.store.reset_stats()
    g = engine.generate(_prompt(PASSAGES), hints=PASSAGES)
    assert (g.chunks_matched, g.chunks_loaded, g.chunks_compiled) == (3, 3, 0)
    assert engine.store.stats().hits == 3
    assert g.recomputed_tokens < g.prompt_tokens and g.ttft_s >= g.link_s > 0
    assert len(g.token_ids) == 8 and g.finish_reason == "length"


def test_legolink_covering_chunks_answers_exactly_like_full(engine):
    engine.compile(PASSAGES)
    reordered = [PASSAGES[2], PASSAGES[0], PASSAGES[2]]  # reordered, one twice
    full = engine.generate(_prompt(reordered), hints=PASSAGES, method="full")
    linked = engine.generate(_prompt(reordered), hints=PASSAGES, method="legolink-1000")
    assert linked.chunks_matched == 3 and linked.chunks_loaded == 2  # two distinct chunks
    assert linked.prompt_tokens == full.prompt_tokens
    assert linked.token_ids == full.token_ids and linked.text == full.text


def test_without_hints_the_store_catalog_is_searched(engine):
    engine.compile(PASSAGES)
    g = engine.generate(_prompt(PASSAGES[:2]))
    assert (g.chunks_matched, g.chunks_loaded) == (2, 2)


def test_unseen_chunk_is_compiled_on_the_fly_or_computed(engine, tmp_path):
    g = engine.generate(_prompt(PASSAGES), hints=PASSAGES)
    assert g.chunks_compiled == 3
    off = RagPic(Config(store=str(tmp_path / "other"), compile_on_miss=False, max_new_tokens=4), lm=engine.lm)
    g = off.generate(_prompt(PASSAGES), hints=PASSAGES)
    assert (g.chunks_loaded, g.chunks_compiled) == (0, 0) and g.recomputed_tokens == g.prompt_tokens


def test_prompt_with_no_cached_chunk_still_answers(engine):
    g = engine.generate("hello there", hints=PASSAGES)
    assert g.chunks_matched == 0 and g.recomputed_tokens == g.prompt_tokens and g.token_ids


def test_streaming_matches_generate_and_chat_messages_work(engine):
    engine.compile(PASSAGES)
    s = engine.stream(_prompt(PASSAGES), hints=PASSAGES)
    pieces = list(s)
    assert "".join(pieces) == s.result.text == engine.generate(_prompt(PASSAGES), hints=PASSAGES).text
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": _prompt(PASSAGES)}]
    assert engine.generate(msgs, hints=PASSAGES).chunks_loaded == 3


def test_legolink0_compiles_its_own_recipe(engine):
    engine.compile(PASSAGES)
    g = engine.generate(_prompt(PASSAGES), hints=PASSAGES, method="legolink-0")
    assert g.chunks_compiled == 3  # plain-recipe KV is not reused for the dummy recipe
    g = engine.generate(_prompt(PASSAGES), hints=PASSAGES, method="legolink-0")
    assert (g.chunks_loaded, g.chunks_compiled) == (3, 0)


def test_bad_chunk_at_ingest_is_named(engine):
    with pytest.raises(ChunkError, match="empty"):
        engine.compile(["fine text", "   "])
    small = RagPic(Config(), lm=tiny_lm("llama", max_position_embeddings=32))
    with pytest.raises(ChunkError, match=r"context window.*text starts 'the quick") as e:
        small.compile(["ok", PASSAGES[0] * 3])
    assert e.value.index == 1


def test_damaged_entry_on_disk_is_recompiled_never_linked(engine, tmp_path, caplog):
    """A bit flipped in a stored KV file: detected, logged, recompiled; the answer is unchanged."""
    import logging

    engine.compile(PASSAGES)
    before = engine.generate(_prompt(PASSAGES), hints=PASSAGES)
    key = engine.chunk_key(PASSAGES[1])
    engine.store.close()
    from ragpic.cache.backends.disk.folder import entry_path

    f = entry_path(tmp_path / "kv", key)  # one file per entry, named by its key
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x10
    f.write_bytes(bytes(data))

    restarted = RagPic(engine.config, lm=engine.lm)  # a new process would open the folder like this
    with caplog.at_level(logging.WARNING, logger="ragpic.cache"):
        after = restarted.generate(_prompt(PASSAGES), hints=PASSAGES)
    assert any(key in r.getMessage() for r in caplog.records)
    assert (after.chunks_loaded, after.chunks_compiled) == (2, 1)
    assert after.token_ids == before.token_ids
    assert restarted.store.stats().corrupt == 1


def test_the_leading_text_links_from_the_last_request_exactly(engine):
    """The template's head is kept from one request for the next (Config.prefix_cache_tokens):
    the same answer, its rows counted as cached, not recomputed."""
    engine.compile(PASSAGES)
    off = RagPic(Config(store=None, prefix_cache_tokens=0, max_new_tokens=8), lm=engine.lm, store=engine.store)
    prompt = _prompt(PASSAGES)
    head = engine.count_tokens(engine.format_prompt(prompt).split(PASSAGES[0])[0])
    first = engine.generate(prompt, hints=PASSAGES)  # fills the prefix cache
    again = engine.generate(_prompt(PASSAGES[::-1]), hints=PASSAGES)  # the same head, other chunks behind it
    plain = off.generate(_prompt(PASSAGES[::-1]), hints=PASSAGES)
    assert head > 8 and len(engine.prefixes) == 1 and len(off.prefixes) == 0
    assert first.recomputed_tokens == plain.recomputed_tokens  # nothing was kept before the first
    assert again.token_ids == plain.token_ids and again.text == plain.text
    assert again.cached_tokens == plain.cached_tokens + head
    assert again.recomputed_tokens == plain.recomputed_tokens - head
    assert engine.generate(prompt, hints=PASSAGES, method="full").recomputed_tokens == first.prompt_tokens
