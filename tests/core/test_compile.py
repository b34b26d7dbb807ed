"""Compile on tiny random models: a chunk compiled in row ranges equals one compile."""

from __future__ import annotations

import pytest
import torch

from ragpic.core.compile import ChunkInParts, compile_chunks
from ragpic.errors import ChunkError
from tiny import tiny_lm

IDS = list(range(5, 45))  # 40 tokens


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma"])
@pytest.mark.parametrize("recipe", ["plain", "bos2"])
def test_a_chunk_in_parts_has_the_kv_of_one_compile(kind, recipe):
    lm = tiny_lm(kind)
    want = compile_chunks(lm, [IDS], recipe=recipe)[0]
    part = ChunkInParts(lm, IDS, recipe)
    assert part.rows == len(IDS) + want.base_position
    ends = [7, 8, 30, part.rows]  # uneven ranges, one of a single row
    got = [part.run(e) for e in ends]
    assert got[:-1] == [None] * 3 and part.done == part.rows
    kv = got[-1]
    assert kv.keys.shape == want.keys.shape and kv.keys.is_contiguous()
    assert kv.base_position == want.base_position and kv.recipe == recipe and kv.fingerprint == want.fingerprint
    assert torch.equal(kv.token_ids, want.token_ids)
    torch.testing.assert_close(kv.keys, want.keys, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kv.values, want.values, atol=1e-5, rtol=1e-5)


def test_a_range_must_move_forward_and_stay_inside_the_chunk():
    part = ChunkInParts(tiny_lm(), IDS)
    part.run(10)
    for end in (10, 5, len(IDS) + 1):
        with pytest.raises(ChunkError, match=f"end={end}"):
            part.run(end)
    assert part.run(len(IDS)) is not None


def test_an_empty_chunk_is_refused_before_any_work():
    with pytest.raises(ChunkError, match="empty"):
        ChunkInParts(tiny_lm(), [])


def test_errors_name_the_callers_chunk():
    with pytest.raises(ChunkError, match="chunk 3 is empty") as err:
        ChunkInParts(tiny_lm(), [], index=3)
    assert err.value.index == 3
    part = ChunkInParts(tiny_lm(), IDS, index=5)
    with pytest.raises(ChunkError, match="chunk 5: end=0") as err:
        part.run(0)
    assert err.value.index == 5
