"""What ``Config(store=...)`` / :func:`ragpic.cache.open_store` accept, checked where it enters.

- ``None`` or ``"memory"``: memory only.
- ``redis://[:password@]host:port/db`` or ``rediss://...``: a Redis server.
- ``redis-cluster://[:password@]host:port[,host:port...]``: a Redis Cluster (any nodes of it;
  the client discovers the rest).
- a folder path (``str`` or ``os.PathLike``); ``~`` is expanded; ``file:///abs/path`` too.

Refused with a :class:`ragpic.errors.ConfigError` naming ``store``: an empty or blank
string (it would write into the current directory), any other URL scheme (``unix://``,
``http://``, ``s3://``... used to become local folders named ``unix:``), a Redis URL
redis-py cannot parse, and anything that is not text or a path.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from ragpic.errors import ConfigError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_WHAT = ("pass a folder path (e.g. ragpic.kv_folder('my_index')), 'redis://host:6379/0' "
         "(or rediss://), 'redis-cluster://host:7000,host:7001', or None for memory only")


@dataclass(frozen=True, slots=True)
class StoreSpec:
    """A checked store spec: ``kind`` is ``memory``, ``redis`` or ``folder``; ``target`` the
    URL or the expanded folder path (``None`` for memory)."""

    kind: str
    target: str | None


def parse_store(spec: object) -> StoreSpec:
    """Check and normalise a store spec (see the module docstring).

    Raises:
        ConfigError: naming ``store``, what was given and what to pass.
    """
    if spec is None:
        return StoreSpec("memory", None)
    if isinstance(spec, bytes) or not isinstance(spec, (str, os.PathLike)):
        raise ConfigError(f"store must be a str or a path, got {type(spec).__name__} {spec!r}: {_WHAT}")
    text = os.fspath(spec)
    if not isinstance(text, str):
        raise ConfigError(f"store must be a text path, got {text!r}: {_WHAT}")
    if not text.strip():
        raise ConfigError(f"store={text!r} is empty (it would write into the current directory): {_WHAT}")
    if text == "memory":
        return StoreSpec("memory", None)
    m = _SCHEME.match(text)
    if m is None:
        return StoreSpec("folder", os.path.expanduser(text))
    scheme = m.group(1).lower()
    if scheme in ("redis", "rediss"):
        return StoreSpec("redis", _check_redis(text))
    if scheme == "redis-cluster":
        cluster_nodes(text)  # raises for a malformed node list
        return StoreSpec("redis", text)
    if scheme == "file":
        url = urlparse(text)
        if url.netloc not in ("", "localhost") or not url.path:
            raise ConfigError(f"store={text!r}: a file:// URL must name a local folder (file:///abs/path): {_WHAT}")
        return StoreSpec("folder", unquote(url.path))
    raise ConfigError(f"store={text!r}: unknown scheme {scheme + '://'!r} (ragpic stores KV in a folder or in "
                      f"Redis, never under a URL it does not know): {_WHAT}")


def _check_redis(url: str) -> str:
    try:
        from redis.connection import parse_url
    except ImportError:
        raise ConfigError(f"store={url!r} needs redis-py: pip install 'ragpic[redis]'") from None
    try:
        parse_url(url)
    except ValueError as exc:
        raise ConfigError(f"store={url!r} is not a valid Redis URL ({exc}): pass redis://host:port/db") from None
    return url


def cluster_nodes(url: str) -> tuple[list[tuple[str, int]], str | None]:
    """``redis-cluster://[:password@]h1:p1,h2:p2`` -> ``([(h1, p1), (h2, p2)], password)``.

    Raises:
        ConfigError: naming ``store``, for an empty node list or a node without a numeric port.
    """
    rest = url.split("://", 1)[1].split("/", 1)[0]
    password = None
    if "@" in rest:
        auth, rest = rest.rsplit("@", 1)
        password = unquote(auth.split(":", 1)[-1]) or None
    nodes = []
    for part in (p.strip() for p in rest.split(",")):
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"store={url!r}: cluster node {part!r} is not host:port; pass "
                              f"redis-cluster://host:7000,host:7001 (any nodes of the cluster)")
        nodes.append((host, int(port)))
    return nodes, password
