"""Which models ragpic can link: a decoder whose keys carry a static rotary position embedding.

A key computed at position p can be moved to p + d by one more rotation of angle d only when the
rotation's angle is a fixed function of (position, frequency) (docs/ARCHITECTURE.md §4.1). Checked
from the config alone, before any weight is read or converted.
"""

from __future__ import annotations

from ragpic.errors import UnsupportedModelError

__all__ = ["STATIC_ROPE_TYPES", "SUPPORTED_MODEL_TYPES", "check_supported"]

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma")
# RoPE types whose angle is a fixed function of (position, frequency): a key computed at
# position p can be moved to p + d by one more rotation of angle d. Dynamic NTK, YaRN and
# longrope rescale with the sequence length (or scale cos/sin), so that identity breaks.
STATIC_ROPE_TYPES = ("default", "linear", "llama3")


def check_supported(config) -> None:
    """Raise :class:`UnsupportedModelError` unless the config's RoPE can be re-rotated exactly."""
    model_type = getattr(config, "model_type", "?")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model type {model_type!r} is not supported by ragpic: linking needs a decoder whose "
            f"keys carry a plain rotary position embedding. Supported: {', '.join(SUPPORTED_MODEL_TYPES)}."
        )
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in STATIC_ROPE_TYPES:
        raise UnsupportedModelError(
            f"{model_type} model uses rope_type {rope_type!r}, whose rotation depends on the sequence "
            f"length or rescales cos/sin, so cached keys cannot be moved to new positions exactly. "
            f"Supported rope types: {', '.join(STATIC_ROPE_TYPES)}."
        )
