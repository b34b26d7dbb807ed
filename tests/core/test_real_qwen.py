"""The exactness tests of test_link_exact.py and test_query_guided.py, once on real weights:
Qwen2.5-Coder-0.5B-Instruct (qwen2 with QKV bias, RoPE theta 1e6, 14 query / 2 KV heads),
loaded from its GGUF the way a user does (``Config(model="....gguf")``), in fp32.

Slow tier (marker ``real_model``): it needs the assembled GGUF (``ragpic model get
qwen2.5-coder-0.5b``, ~0.5 GB, which .ci/run does) and skips with that command otherwise. The
first run also dequantizes the file once into the ragpic cache (~2.5 GB of fp32 safetensors).
"""

from __future__ import annotations

import pytest
import torch

from ragpic.core.link import link
from ragpic.core.model import load_model
from ragpic.models import MODELS, gguf_path
from prompts import compile_in_place, compile_texts, linked_prompt

pytestmark = pytest.mark.real_model
MODEL = MODELS["qwen2.5-coder-0.5b"]
TOL = 1e-4


@pytest.fixture(scope="module")
def qwen():
    path = gguf_path(MODEL)
    if not (path.is_file() and path.stat().st_size == MODEL.size):
        pytest.skip(f"needs the real {MODEL.name} GGUF at {path}: run `ragpic model get {MODEL.name}` (~0.5 GB)")
    lm = load_model(str(path), device="cpu", dtype="float32")
    cfg = lm.model.config
    # the architecture the tiny models only imitate
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size) == ("qwen2", 24, 896)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (14, 2)
    assert cfg.rope_parameters["rope_theta"] == 1e6
    assert lm.model.model.layers[0].self_attn.q_proj.bias is not None
    return lm


@pytest.fixture(scope="module")
def prompt(qwen):
    """Template head, three short chunks (glue between the first two), the question."""
    segs = linked_prompt(qwen, compile_texts(qwen))
    return segs, link(qwen, segs, "full")


@pytest.mark.parametrize("method", ["legolink-1000", "qr-100", "qp-100", "qp-100-h2", "qr-100-k4-h1-w-t4",
                                    "qr-100-k4-h1-w-s-t4"])
def test_exact_methods_equal_full_on_the_real_model(qwen, prompt, method):
    segs, full = prompt
    linked = link(qwen, segs, method)
    n = full.num_tokens
    # legolink-1000 recomputes every row once; qr-100 after its legolink-16 first pass, qp-100
    # after its probe pass over legolink-16's rows through half the layers
    assert linked.recomputed == n if method == "legolink-1000" else linked.recomputed > n
    assert (full.logits - linked.logits).abs().max() <= TOL
    for a, b in ((full.cache.key_slab, linked.cache.key_slab), (full.cache.value_slab, linked.cache.value_slab)):
        assert (a[..., :n, :] - b[..., :n, :]).abs().max() <= TOL


def test_chunks_compiled_behind_their_context_link_exactly_on_the_real_model(qwen, prompt):
    """A chunk compiled behind exactly the text before it in the prompt (docs/ARCHITECTURE.md
    §1.3) holds ``full``'s rows: ``naive`` then recomputes the question only and still is ``full``."""
    segs, full = prompt
    linked = link(qwen, linked_prompt(qwen, compile_in_place(qwen)), "naive")
    assert linked.num_tokens == full.num_tokens and linked.recomputed == link(qwen, segs, "naive").recomputed
    assert (full.logits - linked.logits).abs().max() <= TOL


def test_naive_is_an_approximation_on_the_real_model(qwen, prompt):
    """The exact methods above are exact because they recompute, not because nothing moved."""
    segs, full = prompt
    assert (full.logits - link(qwen, segs, "naive").logits).abs().max() > 100 * TOL
    assert torch.isfinite(full.logits).all()
