"""How stored KV is quantized: the one table of KV-quant names (stdlib only, like the methods).

``Config(kv_quant=...)``, the command lines and the evaluations' ``@int8`` / ``@int4`` variants
parse a name here once (:func:`parse_kv_quant`); below them a :class:`KVQuant` travels. The entry
format (:mod:`ragpic.cache.format`) has one codec per member. Adding a format is a member here
plus its codec module.
"""

from __future__ import annotations

from enum import Enum

from ragpic.errors import ConfigError

__all__ = ["KVQuant", "parse_kv_quant"]


class KVQuant(str, Enum):
    """A stored entry's KV format. A ``str``: equal to its name, and written as it in headers."""

    NONE = "none"  # the model's dtype, as compiled
    INT8 = "int8"  # per-token, per-head absmax int8 (lossless in practice, DESIGN §5)
    INT4 = "int4"  # KIVI-style: keys per channel, values per token, 4 bits

    __str__ = str.__str__
    __format__ = str.__format__


NAMES = tuple(q.value for q in KVQuant)


def parse_kv_quant(value: str | KVQuant, what: str = "kv_quant") -> KVQuant:
    """The :class:`KVQuant` of ``value``; a :class:`ConfigError` naming ``what`` otherwise."""
    try:
        return KVQuant(value)
    except ValueError:
        raise ConfigError(f"{what} must be one of {NAMES}, got {value!r}") from None
