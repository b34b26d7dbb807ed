"""Bad input gets a clear error that says what to do."""

from __future__ import annotations

import pytest
import torch

from ragpic.errors import ChunkError
from ragpic.core.compile import compile_chunks
from ragpic.errors import LinkError
from ragpic.core.link import link
from ragpic.core.methods import parse_method
from ragpic.errors import UnsupportedModelError
from ragpic.core.model import check_supported, wrap_model
from ragpic.core.segments import Segment, chunk_segment
from tiny import tiny_config, tiny_lm, tiny_tokenizer


def test_empty_chunk_is_refused_naming_it():
    lm = tiny_lm()
    with pytest.raises(ChunkError, match="chunk 1 is empty") as e:
        compile_chunks(lm, [[5, 6], []])
    assert e.value.index == 1


def test_chunk_longer_than_context_is_refused():
    lm = tiny_lm(max_position_embeddings=64)
    with pytest.raises(ChunkError, match="more than the model's context window of 64"):
        compile_chunks(lm, [list(range(10, 80))])


def test_prompt_over_context_window_is_refused_not_truncated():
    lm = tiny_lm(max_position_embeddings=64)
    seg = Segment(token_ids=torch.arange(10, 60))
    link(lm, [seg], "full", extra_capacity=14)  # exactly fits
    with pytest.raises(LinkError, match="context window of 64.*refuses rather than truncating"):
        link(lm, [seg], "full", extra_capacity=15)


def test_kv_from_another_model_is_refused():
    a, b = tiny_lm(seed=0), tiny_lm(seed=1)
    assert a.fingerprint != b.fingerprint
    kv = compile_chunks(a, [[5, 6, 7]])[0]
    with pytest.raises(LinkError, match="compiled by another model"):
        link(b, [Segment(token_ids=torch.tensor([9])), chunk_segment(kv), Segment(token_ids=torch.tensor([9]))],
             "naive")


def test_wrong_recipe_for_method_is_refused():
    lm = tiny_lm()
    kv = compile_chunks(lm, [[5, 6, 7]], recipe="bos4")[0]
    with pytest.raises(LinkError, match="recipe 'bos4' but legolink-16 needs 'plain'"):
        link(lm, [Segment(token_ids=torch.tensor([9])), chunk_segment(kv)], "legolink-16")


def test_model_without_rope_is_refused():
    from transformers import GPT2Config

    with pytest.raises(UnsupportedModelError, match="'gpt2' is not supported.*Supported: llama"):
        check_supported(GPT2Config())


@pytest.mark.parametrize("rope_type", ["yarn", "dynamic", "longrope"])
def test_length_dependent_rope_is_refused(rope_type):
    cfg = tiny_config("llama")
    cfg.rope_parameters = {"rope_type": rope_type, "factor": 4.0, "rope_theta": 10000.0}
    with pytest.raises(UnsupportedModelError, match=f"rope_type '{rope_type}'"):
        check_supported(cfg)


def test_wrap_model_checks_before_use():
    from transformers import GPT2Config, GPT2LMHeadModel

    with pytest.raises(UnsupportedModelError):
        wrap_model(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2)), tiny_tokenizer())


@pytest.mark.parametrize("bad", ["quick", "legolink", "legolink-x", "cacheblend-0", "cacheblend-101",
                                 "qr", "qr-0", "qr-101", "qr-3-k", "qr-3-kx", "qr-3-k1-k2", "qr--k1",
                                 "qp", "qp-0", "qp-3-k", "experimental:qr-0", "experimental:fast-1"])
def test_unknown_method_lists_valid_ones(bad):
    with pytest.raises(ValueError, match="use 'auto'.*a preset \\(fast, balanced, faithful\\), 'full', 'naive' or "
                                         "'legolink-<k>'.*'experimental:<recipe>'"):
        parse_method(bad, experimental=True)


@pytest.mark.parametrize("name,k,ratio", [("qr-3", 16, 0.03), ("qr-2.5", 16, 0.025), ("QR-10-K1", 1, 0.1),
                                          ("qr-100-k0", 0, 1.0)])
def test_qr_names_parse_and_print_back(name, k, ratio):
    m = parse_method(name, experimental=True)
    assert (m.kind, m.k, m.ratio, m.recipe) == ("qr", k, pytest.approx(ratio), "plain")
    assert parse_method(m.name, experimental=True) == m and m.name == name.lower()
    assert parse_method(f"experimental:{name}") == m  # the public spelling of an experimental recipe


def test_empty_prompt_is_refused():
    with pytest.raises(LinkError, match="empty"):
        link(tiny_lm(), [Segment(token_ids=torch.zeros(0, dtype=torch.long))], "full")


def test_adapter_errors_live_in_errors_and_the_server_modules_that_raise_them_re_export_them():
    from ragpic import errors
    from ragpic.errors import UsageError
    from ragpic.serve.bodies import BadRequest
    from ragpic.serve.scheduler import QueueFull

    assert (UsageError, BadRequest, QueueFull) == (errors.UsageError, errors.BadRequest, errors.QueueFull)
    for cls in (UsageError, BadRequest, QueueFull):  # under RagPicError, out of the adapters' ValueError handlers
        assert issubclass(cls, errors.RagPicError) and not issubclass(cls, ValueError)
    bad = BadRequest("too big", status=413, param="body", code="c")
    assert (str(bad), bad.status, bad.param, bad.code) == ("too big", 413, "body", "c")
    assert UsageError("--port 0", prog="ragpic serve").prog == "ragpic serve"
