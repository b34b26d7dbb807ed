"""Tiny random-weight models and a tokenizer trained in-process: no download, fast."""

from __future__ import annotations

import functools

import torch

TEXT = (
    "the quick brown fox jumps over the lazy dog. a needle hides in the haystack near dolores park. "
    "question: what is the best thing to do in san francisco? answer: eat a sandwich and sit in the sun. "
    "passages are compiled once and linked many times; positions move, the keys rotate with them. "
)


@functools.lru_cache(maxsize=1)
def tiny_tokenizer():
    """A byte-level BPE with a chat template and <s>/</s> specials, trained on TEXT."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([TEXT] * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
    )
    return fast


def tiny_config(kind: str = "llama", **overrides):
    import transformers

    common = dict(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
    )
    common.update(overrides)
    cls = {
        "llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
        "mistral": transformers.MistralConfig, "qwen3": transformers.Qwen3Config,
        "gemma": transformers.GemmaConfig,
    }[kind]
    if kind == "mistral":
        common.setdefault("sliding_window", None)
    if kind in ("qwen3", "gemma"):
        common.setdefault("head_dim", 16)
    return cls(**common)


def tiny_lm(kind: str = "llama", seed: int = 0, attn: str = "sdpa", banded: bool = True, **overrides):
    """A random-weight model of ``kind`` wrapped for ragpic, fp32 on the CPU (on ragpic's
    banded attention when ``attn`` is ``sdpa`` and ``banded``, as ``load_model`` does)."""
    from transformers import AutoModelForCausalLM

    from ragpic.core.model import wrap_model

    torch.manual_seed(seed)
    cfg = tiny_config(kind, **overrides)
    cfg._attn_implementation = attn
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).float()
    # Random init is tiny: scale weights up so attention patterns are far from uniform
    # and a wrong position or mask shows up as a large logit difference.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(8.0)
    return wrap_model(model, tiny_tokenizer(), name=f"tiny-{kind}-{seed}", banded_attention=banded)


def saved_tiny_model(folder, kind: str = "llama", **overrides):
    """Save ``tiny_lm(kind, **overrides)`` as an HF model folder (for CLI ``--model PATH`` tests); returns it."""
    lm = tiny_lm(kind, **overrides)
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return folder
