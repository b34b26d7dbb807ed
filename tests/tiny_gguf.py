"""Tiny random models written as GGUF files with the ``gguf`` package (llama.cpp's layout)."""

from __future__ import annotations

import json

import numpy as np

from tiny import tiny_lm

ROPE_THETA = 1e6  # not the 1e4 default: a lost rope.freq_base shows up as wrong logits


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp stores llama Q/K rows interleaved per head (transformers' GGUF reader undoes it)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensors(model, arch: str):
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    yield "token_embd.weight", sd["model.embed_tokens.weight"]
    yield "output_norm.weight", sd["model.norm.weight"]
    yield "output.weight", sd["lm_head.weight"]
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}  # qwen3's per-head norms
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            for part in ("weight", "bias"):
                key = f"model.layers.{i}.{hf}.{part}"
                if key not in sd:
                    continue
                w = sd[key]
                if arch == "llama" and gg in ("attn_q", "attn_k"):
                    heads = cfg.num_attention_heads if gg == "attn_q" else cfg.num_key_value_heads
                    w = _llama_cpp_permute(w, heads)
                yield f"blk.{i}.{gg}.{part}", w


def write_tiny_gguf(path, kind: str = "qwen2", *, arch: str | None = None, seed: int = 0,
                    quant: str | dict[str, str] | None = None, tied: bool = False, extra: dict | None = None,
                    **overrides):
    """Write ``tiny_lm(kind)`` as a GGUF file (fp32 tensors, byte-level BPE tokenizer).

    ``quant`` (``"Q4_0"``, ``"Q4_1"``, ``"Q8_0"``...): store every 2-D weight in that GGML type,
    quantized by the ``gguf`` package as llama.cpp would (the source model's logits then differ
    from the file's: compare with the file loaded dense); a dict maps a fragment of the tensor's
    name to its type (the first that matches; ``""`` for the rest), as a Q4_K_M file mixes types.
    ``tied``: no ``output.weight`` (the head reads the embedding); ``extra``: more tensors by name.
    ``arch`` overrides ``general.architecture`` (to write a file ragpic must refuse);
    ``overrides`` go to :func:`tiny.tiny_config`. Returns the wrapped source model, whose
    logits the converted one must reproduce.
    """
    import gguf

    lm = tiny_lm(kind, seed=seed, rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA}, **overrides)
    cfg, tok = lm.model.config, lm.tokenizer
    w = gguf.GGUFWriter(str(path), arch or kind)
    w.add_name(f"tiny-{kind}")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    if kind == "qwen3":  # head_dim is not hidden / heads there
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    spec = json.loads(tok.backend_tokenizer.to_str())["model"]
    vocab = sorted(spec["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab] + [f"<unused{i}>" for i in range(cfg.vocab_size - len(vocab))]
    specials = set(tok.all_special_tokens)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["merges"]])
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    w.add_pad_token_id(cfg.pad_token_id)
    w.add_chat_template(tok.chat_template)
    for name, tensor in [*_tensors(lm.model, arch or kind), *(extra or {}).items()]:
        if tied and name == "output.weight":
            continue
        tensor = np.ascontiguousarray(tensor, dtype=np.float32)
        qname = quant if not isinstance(quant, dict) else next((q for frag, q in quant.items() if frag in name), None)
        if qname is not None and tensor.ndim == 2:
            qtype = gguf.GGMLQuantizationType[qname]
            w.add_tensor(name, gguf.quants.quantize(tensor, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return lm
