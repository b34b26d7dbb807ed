"""The one compile pipeline (ragpic/engine/compile_pipeline.py) on a tiny random model: every entry
point's chunks pass through it, groups reach the store as they finish, errors name the caller's
chunk, and what the evaluations (and so calibration) link is what an in-order ingest stores."""

from __future__ import annotations

import pytest
import torch

from ragpic import Config, RagPic
from ragpic.cache import chunk_key
from ragpic.cache.format.expect import expected_for
from ragpic.core.compile import compile_chunks
from ragpic.core.compile_recipe import context_recipe
from ragpic.engine.compile_pipeline import ChunkJob, StoreWriter, compile_entries, text_jobs
from ragpic.errors import ChunkError, ConfigError
from ragpic.eval.variants import compile_for
from tiny import tiny_lm

DOC = [
    "the quick brown fox jumps over the lazy dog near the park.",
    "a needle hides in the haystack near dolores park today.",
    "answer: eat a sandwich and sit in the sun by the water.",
    "the lazy dog wakes up and chases the quick brown fox away.",
]


@pytest.fixture(scope="module")
def lm():
    return tiny_lm("llama", num_hidden_layers=2)


def test_groups_reach_the_sink_as_they_finish_and_a_failure_names_the_callers_chunk(lm):
    jobs = text_jobs(lm.tokenizer, [(f"k{i}", t) for i, t in enumerate(DOC)], [f"essay.md#{i}" for i in range(4)],
                     [10, 11, 12, 13])
    jobs.append(ChunkJob([], "essay.md#4", "k4", "", index=14))  # empty: the core refuses it
    seen: list[list[str]] = []
    with pytest.raises(ChunkError, match=r"^essay.md#4 is empty") as e:
        compile_entries(lm, jobs, batch_tokens=4096, every=2, sink=lambda js, kvs: seen.append([j.key for j in js]))
    assert e.value.index == 14
    assert seen == [["k0", "k1"], ["k2", "k3"]]  # an interrupted ingest keeps the groups it finished


def test_the_pipeline_gives_the_cores_kv_and_the_writer_stores_it(lm, tmp_path):
    engine = RagPic(Config(store=str(tmp_path / "kv"), kv_quant="none"), lm=lm)
    todo = [(engine.chunk_key(t, "legolink-16"), t) for t in DOC]
    writer = StoreWriter(engine.store, keep=True)
    assert compile_entries(lm, text_jobs(lm.tokenizer, todo), batch_tokens=64, sink=writer, every=3) == 4
    want = compile_chunks(lm, [j.ids for j in text_jobs(lm.tokenizer, todo)], batch_tokens=64)
    got = engine.store.get_many([k for k, _ in todo], expect=expected_for(lm))
    assert writer.written == [k for k, _ in todo] and list(writer.kvs) == writer.written
    for (k, _), w in zip(todo, want):
        assert torch.equal(got[k].keys, w.keys) and torch.equal(got[k].values, w.values)


def test_contexts_need_the_plain_recipe(lm):
    with pytest.raises(ConfigError, match="give contexts with the 'plain' recipe"):
        compile_entries(lm, [ChunkJob([5, 6], "x", context=[3])], "bos1", batch_tokens=64, sink=lambda *_: None)


def test_an_evaluations_prev_variant_links_what_an_in_order_ingest_stores(lm, tmp_path):
    """Calibration's ``@prev1`` rows are measured on the KV a store holds after
    ``compile(in_order=True)`` (separator "" : nothing between the chunks, as in the evaluations' prompts)."""
    engine = RagPic(Config(store=str(tmp_path / "kv"), kv_quant="none", compile_behind=1, min_chunk_tokens=1), lm=lm)
    engine.compile(DOC, in_order=True, separator="")
    ids = [lm.tokenizer(t, add_special_tokens=False)["input_ids"] for t in DOC]
    evaluated = compile_for(lm, ids, ["naive@prev1"])["plain@prev1"]
    keys = [chunk_key(lm.fingerprint, DOC[i], context_recipe(ids[i - 1]), lm.dtype) for i in range(1, 4)]
    stored = engine.store.get_many(keys, expect=expected_for(lm))
    assert len(stored) == 3
    for k, kv in zip(keys, evaluated[1:]):
        assert stored[k].recipe == kv.recipe and stored[k].base_position == kv.base_position
        # both from forwards of their own batch shapes: equal to rounding (the exactness tests' fp32 bound)
        torch.testing.assert_close(stored[k].keys, kv.keys, rtol=0, atol=1e-5)
        torch.testing.assert_close(stored[k].values, kv.values, rtol=0, atol=1e-5)
