"""Which attention links a model is read from the model's live setting: a user who switches
the model back to plain ``sdpa`` gets exact links through transformers' own SDPA."""

from __future__ import annotations

import pytest

from prompts import prompt_with
from ragpic.core.link import link
from ragpic.core.ops import attention
from tiny import tiny_lm


@pytest.fixture
def banded_calls(monkeypatch):
    """Counts the banded path's SDPA calls (``grouped_sdpa`` runs only inside ``banded_sdpa``)."""
    calls = []
    real = attention.grouped_sdpa

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "grouped_sdpa", counting)
    return calls


def test_switching_back_to_sdpa_links_exactly_without_bands(banded_calls):
    lm = tiny_lm("llama", num_hidden_layers=3)  # wrapped with banded_attention=True
    segs = prompt_with(lm)
    full = link(lm, segs, "full")
    assert lm.banded_attention
    banded = link(lm, segs, "legolink-1000")
    assert len(banded_calls) > 0, "ragpic_sdpa should have run the link"
    lm.model.set_attn_implementation("sdpa")  # the user takes their model back
    banded_calls.clear()
    assert not lm.banded_attention and lm.bands(segs[0].token_ids) is None
    plain = link(lm, segs, "legolink-1000")
    assert banded_calls == [], "the link must not use ragpic's banded attention any more"
    assert lm.model.config._attn_implementation == "sdpa"
    assert (plain.logits - full.logits).abs().max() <= 1e-4
    assert (plain.logits - banded.logits).abs().max() <= 1e-4


def test_wrap_model_leaves_a_users_attention_alone_unless_asked():
    from ragpic.core.model import wrap_model

    lm = tiny_lm("llama", num_hidden_layers=1, banded=False)
    assert lm.model.config._attn_implementation == "sdpa" and not lm.banded_attention
    again = wrap_model(lm.model, lm.tokenizer, name="mine", banded_attention=True)
    assert again.banded_attention and lm.model.config._attn_implementation == attention.ATTENTION_NAME
