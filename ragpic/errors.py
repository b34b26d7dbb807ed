"""Every exception ragpic raises on purpose, in one place: catch :class:`RagPicError` for all.

Each also subclasses the builtin a caller would expect (``ValueError`` for bad input), so
code written against the builtins keeps working. This module imports nothing.

::

    RagPicError
    ├── ConfigError           a setting or argument is invalid (the message names it)
    ├── UnsupportedModelError the model cannot be linked exactly (no RoPE, dynamic RoPE...)
    ├── ChunkError            a chunk cannot be compiled (``index`` says which)
    ├── LinkError             the prompt cannot be linked as asked
    │   └── ContextOverflowError  prompt + answer exceed the context window
    ├── GenerationTimeout     a call ran past its ``timeout`` (also a ``TimeoutError``)
    └── StoreError            the KV store cannot do what was asked (e.g. a write failed)
        ├── CorruptEntry      a stored entry fails its checks (deleted and recompiled)
        └── ForeignEntry      a stored entry belongs to another model or recipe
"""

from __future__ import annotations

__all__ = [
    "BatchNotHonoured",
    "ChunkError",
    "ConfigError",
    "ContextOverflowError",
    "CorruptEntry",
    "ForeignEntry",
    "GenerationTimeout",
    "LinkError",
    "RagPicError",
    "StoreError",
    "UnsupportedModelError",
]


class RagPicError(Exception):
    """Base of every error ragpic raises on purpose."""


class ConfigError(RagPicError, ValueError):
    """A setting or argument is invalid; the message names it and says what to pass."""


class UnsupportedModelError(RagPicError, ValueError):
    """The model cannot be linked exactly (no RoPE, or a RoPE variant that is not static)."""


class ChunkError(RagPicError, ValueError):
    """A chunk cannot be compiled; the message names the chunk, ``index`` is its position."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


class LinkError(RagPicError, ValueError):
    """The prompt cannot be linked as asked (too long, foreign KV, wrong recipe...)."""


class ContextOverflowError(LinkError):
    """The prompt plus the tokens to generate do not fit the model's context window."""


class StoreError(RagPicError):
    """The KV store cannot do what was asked (a write failed, the disk is full...)."""


class CorruptEntry(StoreError, ValueError):
    """A stored entry's bytes fail their checks (truncated, bit flips, bad header)."""


class ForeignEntry(StoreError, ValueError):
    """A well-formed entry that belongs to another model fingerprint, recipe or key."""


class GenerationTimeout(RagPicError, TimeoutError):
    """A call ran past its ``timeout`` (seconds); text already streamed stays with the caller."""


class BatchNotHonoured(RuntimeError):
    """A batched decode step's attention ignored its per-row plan (its logits are wrong; the
    caches' new rows are rewritten by the next forward at the same positions, so stepping the
    requests one at a time afterwards is safe). Raised by ``ragpic.core.batch``; the server
    catches it and stops batching."""
