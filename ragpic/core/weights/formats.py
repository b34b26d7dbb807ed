"""How a model's weights are held: the one table of weight-format names (stdlib only).

``Config(weights=...)``, ``load_model(weights=...)`` and the command lines' ``--weights`` parse a
name here once (:func:`parse_weights`); below them a :class:`WeightFormat` travels. What each
format costs and keeps is measured in docs/RESULTS.md §17; what ``auto`` resolves to is
:func:`ragpic.core.weights.resolve.resolve_weights` (docs/ARCHITECTURE.md §4.8).
"""

from __future__ import annotations

from enum import Enum

from ragpic.errors import ConfigError

__all__ = ["NAMES", "WeightFormat", "parse_weights"]


class WeightFormat(str, Enum):
    """A loaded model's weight format. A ``str``: equal to its name (it is part of the fingerprint)."""

    AUTO = "auto"  # resolved at load: the file's own blocks for a GGUF on a CPU with native bf16, else dense
    DENSE = "dense"  # every weight in the compute dtype (fp32, bf16 or fp16: Config.dtype)
    INT8 = "int8"  # linear layers weight-only int8, one scale per output row
    INT4 = "int4"  # linear layers weight-only int4, a scale and zero point per 32 inputs
    GGUF = "gguf"  # a GGUF's Q4_0/Q4_1/Q4_K blocks kept as int4 (exact), every other tensor re-quantized to int4

    __str__ = str.__str__
    __format__ = str.__format__

    @property
    def quantized(self) -> bool:
        return self in (WeightFormat.INT8, WeightFormat.INT4, WeightFormat.GGUF)


NAMES = tuple(f.value for f in WeightFormat)


def parse_weights(value: str | WeightFormat, what: str = "weights") -> WeightFormat:
    """The :class:`WeightFormat` of ``value``; a :class:`ConfigError` naming ``what`` otherwise."""
    try:
        return WeightFormat(value)
    except ValueError:
        raise ConfigError(f"{what} must be one of {NAMES}, got {value!r} (auto: the GGUF's own blocks where "
                          "torch has kernels for them, else dense; docs/RESULTS.md §17)") from None
