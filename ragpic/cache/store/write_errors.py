"""Say what went wrong with a store call, in words a user can act on."""

from __future__ import annotations

import errno

from ragpic.cache.backends.base import KVBackend
from ragpic.errors import StoreError

_HINTS = {
    errno.ENOSPC: "the disk is full: free space, lower store_size_limit_gb or point store= at a bigger disk",
    errno.EROFS: "point store= at a writable folder to add chunks; reads still work",
    errno.EACCES: "point store= at a folder this process may write; reads still work",
    errno.EDQUOT: "the disk quota is exhausted: free space or point store= elsewhere",
}


def describe(exc: BaseException) -> str:
    """``Type: message`` plus a hint for the causes a user can fix (full disk, read-only...)."""
    text = f"{type(exc).__name__}: {exc}"
    code = getattr(exc, "errno", None)
    if code in _HINTS:
        return f"{text} ({_HINTS[code]})"
    low = str(exc).lower()
    if "disk is full" in low:
        return f"{text} ({_HINTS[errno.ENOSPC]})"
    if "readonly" in low or "read-only" in low:
        return f"{text} ({_HINTS[errno.EROFS]})"
    return text


def is_unreachable(backend: KVBackend | None, exc: BaseException) -> bool:
    """Whether ``exc`` means the backend cannot be reached at all (both directions down):
    the backend judges (:meth:`KVBackend.is_unreachable`); builtin timeouts always count."""
    if backend is not None:
        return backend.is_unreachable(exc)
    return isinstance(exc, (TimeoutError, ConnectionError))


def write_error(text: str, key: str, exc: BaseException, stored: int, total: int) -> StoreError:
    """The :class:`StoreError` an ingest raises: which chunk, why, and what was kept."""
    return StoreError(f"chunk {text[:60]!r} (key {key[:12]}) could not be stored: {describe(exc)}; "
                      f"{stored} of the {total} chunks of this batch were stored and are catalogued")
