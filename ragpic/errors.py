"""Every exception ragpic raises on purpose, in one place: catch :class:`RagPicError` for all.

Each also subclasses the builtin a caller would expect (``ValueError`` for bad input), so
code written against the builtins keeps working. This module imports nothing.

::

    RagPicError
    ├── ConfigError           a setting or argument is invalid (the message names it)
    ├── UnsupportedModelError the model cannot be linked exactly (no RoPE, dynamic RoPE...)
    ├── ModelFileError        a model file is unreadable, truncated or fails its SHA-256 check
    ├── ChunkError            a chunk cannot be compiled (``index`` says which)
    ├── LinkError             the prompt cannot be linked as asked
    │   └── ContextOverflowError  prompt + answer exceed the context window
    ├── GenerationTimeout     a call ran past its ``timeout`` (also a ``TimeoutError``)
    ├── BatchNotHonoured      a batched decode step's attention ignored its plan (stepped alone)
    ├── StoreError            the KV store cannot do what was asked (e.g. a write failed)
    │   ├── CorruptEntry      a stored entry fails its checks (deleted and recompiled)
    │   ├── ForeignEntry      a stored entry belongs to another model or recipe
    │   ├── IndexDamaged      a folder store's index.sqlite is damaged (moved aside, rebuilt)
    │   └── UnsafePath        a key or path would leave the store folder (also a ValueError)
    ├── UsageError            ``ragpic``: a command-line argument is wrong (exit status 2)
    ├── BadRequest            ``ragpic serve``: a request that cannot be served as sent (4xx)
    ├── QueueFull             ``ragpic serve``: the wait queue is full (HTTP 429)
    ├── ShuttingDown          ``ragpic serve``: shutting down, the request is refused or cut (HTTP 503)
    └── ClientGone            ``ragpic serve``: the client left; its job is dropped

The last five belong to the adapters (the command line, the server), which turn them into
an exit status or an HTTP response; a library caller never sees them. They subclass no
builtin, so the adapters' ``except ValueError`` / ``except ConfigError`` handlers never take them.
"""

from __future__ import annotations

__all__ = [
    "BadRequest",
    "BatchNotHonoured",
    "ChunkError",
    "ClientGone",
    "ConfigError",
    "ContextOverflowError",
    "CorruptEntry",
    "ForeignEntry",
    "GenerationTimeout",
    "IndexDamaged",
    "LinkError",
    "ModelFileError",
    "QueueFull",
    "RagPicError",
    "ShuttingDown",
    "StoreError",
    "UnsafePath",
    "UnsupportedModelError",
    "UsageError",
]


class RagPicError(Exception):
    """Base of every error ragpic raises on purpose."""


class ConfigError(RagPicError, ValueError):
    """A setting or argument is invalid; the message names it and says what to pass."""


class UnsupportedModelError(RagPicError, ValueError):
    """The model cannot be linked exactly (no RoPE, or a RoPE variant that is not static)."""


class ModelFileError(RagPicError, ValueError):
    """A model file (GGUF, assembled parts) is unreadable, truncated or fails its SHA-256 check."""


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


class IndexDamaged(StoreError):
    """A folder store's ``index.sqlite`` is not a ragpic index or is damaged; the message says
    how. Raised while opening it, which then moves it aside and rebuilds it from the entries."""


class UnsafePath(StoreError, ValueError):
    """A key or path that would leave the store folder (or is not a ragpic key)."""


class GenerationTimeout(RagPicError, TimeoutError):
    """A call ran past its ``timeout`` (seconds); text already streamed stays with the caller."""


class UsageError(RagPicError):
    """A command-line argument is wrong; the message names it and says what to pass (exit 2).

    ``prog`` is the command it belongs to (``ragpic demo``...), set by the parser or by ``main``.
    """

    def __init__(self, message: str, prog: str | None = None):
        super().__init__(message)
        self.prog = prog


class BadRequest(RagPicError):
    """A request that cannot be served as sent: ``status`` (4xx), ``param``, ``code``."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


class QueueFull(RagPicError):
    """The batch is full and ``max_queue`` requests wait beyond it already (HTTP 429)."""


class ShuttingDown(RagPicError):
    """The server is shutting down: it takes no new request, and this one ran out of time (HTTP 503)."""


class ClientGone(RagPicError):
    """The client closed its connection before the answer (its job is dropped, nothing is sent)."""


class BatchNotHonoured(RagPicError, RuntimeError):
    """A batched decode step's attention ignored its per-row plan (its logits are wrong; the
    caches' new rows are rewritten by the next forward at the same positions, so stepping the
    requests one at a time afterwards is safe). Raised by ``ragpic.core.batch``; the server
    catches it and stops batching."""
