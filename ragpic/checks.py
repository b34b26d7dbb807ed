"""Argument checks at ragpic's entry points: each failure is a :class:`ConfigError` that names
the argument and says what to pass. Imports nothing but :mod:`ragpic.errors`."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from ragpic.errors import ConfigError

__all__ = ["check_int", "check_number", "check_stop", "check_text", "check_texts"]


def check_int(name: str, value: object, *, minimum: int) -> int:
    """``value`` if it is an integer ``>= minimum`` (``bool`` is not an integer here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_number(name: str, value: object, what: str, ok: Callable[[float], bool]) -> float:
    """``value`` if it is a real number, not NaN, for which ``ok`` holds; ``what`` describes it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or not ok(value):
        raise ConfigError(f"{name} must be {what}, got {value!r}")
    return value


def check_text(name: str, value: object) -> str:
    """``value`` if it is a ``str`` that encodes as UTF-8 (no lone surrogates)."""
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a str, got {type(value).__name__} {_short(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ConfigError(
            f"{name} contains {value[e.start]!r} at index {e.start}, a lone surrogate that is not valid "
            f"Unicode text (it cannot be encoded as UTF-8): decode your text with errors='replace' or "
            f"drop the character"
        ) from None
    return value


def check_texts(name: str, value: object) -> list[str]:
    """A list of texts from an iterable of ``str``; a bare ``str`` is refused (it would be taken
    one character at a time)."""
    if isinstance(value, (str, bytes)):
        raise ConfigError(f"{name} must be a list of texts, got a single {type(value).__name__}: "
                          f"pass [{_short(value)}]")
    if not isinstance(value, Iterable):
        raise ConfigError(f"{name} must be a list of texts, got {type(value).__name__} {_short(value)}")
    return [check_text(f"{name}[{i}]", t) for i, t in enumerate(value)]


def check_stop(value: object) -> tuple[str, ...]:
    """Stop strings as a tuple: ``None`` -> ``()``, a single ``str`` is one stop string (as in
    the OpenAI API), else an iterable of non-empty ``str``."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    stops = tuple(check_texts("stop", value))
    if any(not s for s in stops):
        raise ConfigError("stop strings must be non-empty, got an empty string in stop")
    return stops


def _short(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
