"""How a model's weights are held: dense, or weight-only int8/int4 on torch's CPU kernels, or a
GGUF's own 4-bit blocks (docs/ARCHITECTURE.md §4.8)."""

from ragpic.core.weights.formats import NAMES, WeightFormat, parse_weights

__all__ = ["NAMES", "WeightFormat", "parse_weights"]
