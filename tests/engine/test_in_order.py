"""One document's chunks compiled in order (docs/ARCHITECTURE.md §1.3) through the engine, on a
tiny random model: each chunk is also stored behind the chunks before it, and a prompt that
holds it right after them links that entry; any other prompt links the chunk alone."""

from __future__ import annotations

import pytest

from ragpic import Config, RagPic
from ragpic.core.compile_recipe import PLAIN
from ragpic.errors import ConfigError
from tiny import tiny_lm

DOC = [
    "the quick brown fox jumps over the lazy dog near the park.",
    "a needle hides in the haystack near dolores park today.",
    "answer: eat a sandwich and sit in the sun by the water.",
    "the lazy dog wakes up and chases the quick brown fox away.",
]


def _prompt(passages, sep="\n\n"):
    return "passages:\n" + sep.join(passages) + "\n\nquestion: what is the best thing to do?"


@pytest.fixture
def engine(tmp_path):
    """Contexts of the chunks before only (``compile_head=False``, the default)."""
    lm = tiny_lm("llama", num_hidden_layers=3)
    lm.model.generation_config.eos_token_id = None
    return RagPic(Config(store=str(tmp_path / "kv"), max_new_tokens=6, compile_behind=2, kv_quant="none"), lm=lm)


def _recipes(engine, prompt):
    segs, stats = engine.segments(prompt, hints=DOC)
    return [s.kv.recipe if s.kv is not None else None for s in segs if s.kv is not None], stats


def test_a_prompt_in_document_order_links_the_entries_compiled_behind(engine):
    assert engine.compile(DOC, in_order=True) == 4 + 3  # each chunk alone, and chunks 1-3 behind <= 2 before
    assert engine.compile(DOC, in_order=True) == 0
    recipes, stats = _recipes(engine, _prompt(DOC))
    assert recipes[0] == PLAIN and all(r.startswith("ctx") for r in recipes[1:])
    assert stats.loaded == 4 and stats.compiled == 0
    # chunk 1 read chunk 0 and the separator; chunks 2 and 3 read two chunks and two separators
    base = [int(r[3:].split("-")[0]) for r in recipes[1:]]
    n = [len(engine.lm.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in DOC]
    sep = len(engine.lm.tokenizer("\n\n", add_special_tokens=False)["input_ids"])
    assert base == [n[0] + sep, n[0] + n[1] + 2 * sep, n[1] + n[2] + 2 * sep]


def test_any_other_order_or_separator_links_the_chunks_alone(engine):
    engine.compile(DOC, in_order=True)
    assert _recipes(engine, _prompt(DOC[::-1]))[0] == [PLAIN] * 4
    assert _recipes(engine, _prompt(DOC, sep="\n"))[0] == [PLAIN] * 4  # not the separator compiled behind
    # a run that starts inside the document: chunk 2 follows chunk 1 alone, not the two it was compiled behind
    recipes, _ = _recipes(engine, _prompt(DOC[1:3]))
    assert recipes == [PLAIN, PLAIN]
    # a chunk whose predecessors are there links behind them even where the prompt starts later
    recipes, _ = _recipes(engine, _prompt(DOC[1:4]))
    assert recipes[:2] == [PLAIN, PLAIN] and recipes[2].startswith("ctx")


def test_generation_uses_them_and_full_is_unchanged(engine):
    engine.compile(DOC, in_order=True)
    full = engine.generate(_prompt(DOC), hints=DOC, method="full")
    exact = engine.generate(_prompt(DOC), hints=DOC, method="legolink-1000")
    assert exact.token_ids == full.token_ids
    linked = engine.generate(_prompt(DOC), hints=DOC)
    assert (linked.chunks_loaded, linked.chunks_behind, linked.chunks_compiled) == (4, 3, 0)
    assert len(linked.token_ids) == 6 and full.chunks_behind == 0  # full links no stored KV


def test_off_by_default_and_refused_where_it_cannot_apply(engine, tmp_path):
    off = RagPic(Config(store=str(tmp_path / "off")), lm=engine.lm)
    with pytest.raises(ConfigError, match="compile_behind"):
        off.compile(DOC, in_order=True)
    with pytest.raises(ConfigError, match="compile_behind must be an integer >= 0"):
        Config(compile_behind=-1)
    engine.compile(DOC, in_order=True)
    off_lookup = RagPic(Config(store=str(tmp_path / "kv"), kv_quant="none"), lm=engine.lm)  # same store, option off
    assert _recipes(off_lookup, _prompt(DOC))[0] == [PLAIN] * 4


def test_bad_options_are_refused_before_any_work(engine):
    for sep in ("---", None):
        with pytest.raises(ConfigError, match="separator must be the whitespace"):
            engine.compile(DOC, in_order=True, separator=sep)
    with pytest.raises(ConfigError, match="legolink-0 links chunks compiled behind dummy tokens"):
        engine.compile(DOC, in_order=True, method="legolink-0")
    # nothing was compiled or stored by the refused calls
    assert engine.compile(DOC) == 4 and engine.compile(DOC, method="legolink-0") == 4
    with pytest.raises(ConfigError, match="compile_behind must be at most 16"):
        Config(compile_behind=17)


def test_with_the_chat_opening_every_chunk_reads_the_prompts_own_start(tmp_path):
    lm = tiny_lm("llama", num_hidden_layers=3)
    lm.model.generation_config.eos_token_id = None
    engine = RagPic(Config(store=str(tmp_path / "kv"), max_new_tokens=6, compile_behind=3, kv_quant="none",
                           compile_head=True), lm=lm)
    opening = engine.chat_opening()
    assert opening == engine.compile_head_ids() and not Config().compile_head  # off unless asked
    assert engine.format_prompt("x").startswith(lm.tokenizer.decode(opening))
    assert engine.compile(DOC, in_order=True) == 4 + 4  # the first chunk too: behind the opening alone
    # the document right after the opening: every chunk read exactly what precedes it, so naive is full
    prompt = "\n\n".join(DOC) + "\n\nquestion: what is the best thing to do?"
    linked = engine.generate(prompt, hints=DOC, method="naive")
    assert (linked.chunks_loaded, linked.chunks_behind) == (4, 4)
    assert linked.token_ids == engine.generate(prompt, hints=DOC, method="full").token_ids
    segs, _ = engine.segments(engine.format_prompt(prompt), hints=DOC)
    bases = [s.kv.base_position for s in segs if s.kv is not None]
    n = [len(lm.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in DOC]
    sep = len(lm.tokenizer("\n\n", add_special_tokens=False)["input_ids"])
    assert bases == [len(opening), len(opening) + n[0] + sep, len(opening) + n[0] + n[1] + 2 * sep,
                     len(opening) + n[0] + n[1] + n[2] + 3 * sep]
    # a prompt that starts otherwise (raw, another system prompt) links every chunk alone
    recipes = [s.kv.recipe for s in engine.segments(prompt, hints=DOC)[0] if s.kv is not None]
    assert recipes == [PLAIN] * 4
    other = engine.format_chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": prompt}])
    assert [s.kv.recipe for s in engine.segments(other, hints=DOC)[0] if s.kv is not None] == [PLAIN] * 4


@pytest.mark.parametrize("head, exact", [("passages:\n", True), ("other words:\n", False)])
def test_with_the_applications_leading_text_the_document_links_as_full(tmp_path, head, exact):
    """compile_head="<the text before the first chunk>": each entry reads the whole leading text;
    a prompt whose leading text is another links the chunks alone."""
    lm = tiny_lm("llama", num_hidden_layers=3)
    lm.model.generation_config.eos_token_id = None
    engine = RagPic(Config(store=str(tmp_path / "kv"), max_new_tokens=6, compile_behind=3, kv_quant="none",
                           compile_head=head), lm=lm)
    assert engine.compile_head_ids() == engine.chat_opening(head) != engine.chat_opening()
    engine.compile(DOC, in_order=True)
    naive = engine.generate(_prompt(DOC), hints=DOC, method="naive")
    assert naive.chunks_behind == (4 if exact else 0)
    if exact:  # every row is full's, up to rounding
        assert naive.token_ids == engine.generate(_prompt(DOC), hints=DOC, method="full").token_ids


def test_compile_head_is_checked():
    for bad in ("", 1, None):
        with pytest.raises(ConfigError, match="compile_head must be True"):
            Config(compile_head=bad)


def test_a_document_cut_inside_words_links_whole_with_or_without_hints(tmp_path):
    """A document cut every 37 characters (inside words and numbers, as token-count splitters
    cut) and linked whole (``separator=""``): every piece is found where the pieces meet, from
    the hints and from the store's catalog, and each read what precedes it, so naive is full."""
    lm = tiny_lm("llama", num_hidden_layers=3)
    lm.model.generation_config.eos_token_id = None
    engine = RagPic(Config(store=str(tmp_path / "kv"), max_new_tokens=6, compile_behind=8, kv_quant="none",
                           compile_head="passages:\n", min_chunk_tokens=4), lm=lm)
    doc = " ".join(DOC) + " The keeper logged 12345 hours in the cold month of March."
    pieces = [doc[i:i + 37] for i in range(0, len(doc), 37)]
    assert len(pieces[-1]) > 10 and len(pieces) <= 8  # each stored, each behind every piece before it
    assert sum(p[-1].isalnum() and q[0].isalnum() for p, q in zip(pieces, pieces[1:])) >= 4
    engine.compile(pieces, in_order=True, separator="")
    prompt = "passages:\n" + doc + "\n\nquestion: what is the best thing to do?"
    full = engine.generate(prompt, hints=pieces, method="full")
    for hints in (pieces, None):
        naive = engine.generate(prompt, hints=hints, method="naive")
        assert (naive.chunks_loaded, naive.chunks_behind) == (len(pieces), len(pieces))
        assert naive.token_ids == full.token_ids


def test_a_piece_left_out_of_the_hints_is_said_with_the_neighbours_it_unlinks(tmp_path, caplog):
    """Without its middle piece a document cut inside words leaves the pieces on either side
    ending and starting inside words that nothing linked completes: they are computed as text,
    and one warning names the first of them and the word it is cut in; with every piece there
    is no warning."""
    lm = tiny_lm("llama", num_hidden_layers=3)
    engine = RagPic(Config(store=str(tmp_path / "kv"), max_new_tokens=2, kv_quant="none", min_chunk_tokens=4,
                           method="fast"), lm=lm)  # named: auto's fallback warning on a tiny model is not under test
    doc = " ".join(DOC)
    pieces = [doc[i:i + 37] for i in range(0, len(doc), 37)]
    gap = next(i for i in range(1, len(pieces) - 1)
               if pieces[i - 1][-1].isalnum() and pieces[i][0].isalnum() and pieces[i][-1].isalnum()
               and pieces[i + 1][0].isalnum())
    engine.compile(pieces)
    prompt = "passages:\n" + doc + "\n\nquestion: what is the best thing to do?"
    with caplog.at_level("WARNING", logger="ragpic.engine"):
        _, stats = engine.segments(prompt, hints=pieces)
    assert stats.hints_found == len(pieces) and not caplog.records
    hints = pieces[:gap] + pieces[gap + 1:]
    with caplog.at_level("WARNING", logger="ragpic.engine"):
        _, stats = engine.segments(prompt, hints=hints)
    assert stats.hints_found == len(hints) - 2  # the pieces before and after the gap
    [record] = caplog.records
    assert record.getMessage().startswith(f"2 of {len(hints)} retrieval hints are in the prompt whole but not linked")
    assert f"Hint {gap - 1} ({pieces[gap - 1][:40]!r}...): it ends inside the word" in record.getMessage()
