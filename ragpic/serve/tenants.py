"""Tenants: API keys -> namespaces, and each namespace's context-cache ids.

With one namespace (one API key, several keys of one namespace, or none) a context-cache
id is the store key itself: today's behaviour, an id works on every replica of the store.
With several, :class:`Tenants` keeps, per namespace, the ids it created: an id is a hash of
(namespace, store key), so two namespaces storing the same text get different ids and
neither can tell the other did (``compiled`` in a POST answer means "new in your
namespace"); GET and DELETE see only the caller's ids (404 otherwise). The KV underneath is
shared by content address with a reference count per store key: a DELETE drops the caller's
reference, and the store entry goes with the last one.

Prompt matching is per namespace too (:class:`Namespace`): a prompt links from the store only
the chunks its namespace stored or compiled, so ``cached_tokens`` never says that another
namespace stored a text. Limit (docs/SERVING.md, *Tenants*): the registry lives in this
process (ids are per replica and do not survive a restart).
"""

from __future__ import annotations

import collections
import hashlib
import threading
from pathlib import Path

from ragpic.serve.bodies import BadRequest, quote

__all__ = ["Namespace", "Tenants", "read_keys_file"]


def read_keys_file(path: str | Path) -> dict[str, str]:
    """``key -> namespace`` from a file of ``NAMESPACE KEY`` lines (``#`` comments, blank lines)."""
    keys: dict[str, str] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{path}:{n}: expected 'NAMESPACE KEY', got {len(parts)} fields")
        namespace, key = parts
        if key in keys and keys[key] != namespace:
            raise ValueError(f"{path}:{n}: a key is listed for two namespaces")
        keys[key] = namespace
    return keys


class Tenants:
    """``keys``: API key -> namespace (empty: no key needed, one namespace)."""

    def __init__(self, keys: dict[str, str] | None = None):
        self.keys = dict(keys or {})
        self.shared = len(set(self.keys.values())) <= 1
        self._ids: dict[str, dict[str, str]] = collections.defaultdict(dict)  # namespace -> id -> store key
        self._refs: collections.Counter[str] = collections.Counter()  # store key -> namespaces holding it
        self._own: dict[str, set[str]] = collections.defaultdict(set)  # namespace -> store keys it may link
        self._lock = threading.Lock()

    def namespace(self, authorization: str | None) -> str | None:
        """The caller's namespace from its ``Authorization`` header, or None (not allowed)."""
        if not self.keys:
            return ""
        if not authorization or not authorization.startswith("Bearer "):
            return None
        return self.keys.get(authorization[7:])

    def _id(self, namespace: str, key: str) -> str:
        return "cc-" + hashlib.sha256(f"{namespace}\0{key}".encode()).hexdigest()[:48]

    def add(self, namespace: str, keys: list[str], stored_before: list[bool]) -> list[tuple[str, bool]]:
        """Register store ``keys`` in ``namespace``: ``(id, new)`` each (``new``: compiled for
        the caller; shared mode: not in the store before)."""
        if self.shared:
            return [(k, not hit) for k, hit in zip(keys, stored_before)]
        out = []
        with self._lock:
            mine = self._ids[namespace]
            for key in keys:
                cid = self._id(namespace, key)
                new = cid not in mine
                if new:
                    mine[cid] = key
                    self._refs[key] += 1
                self._own[namespace].add(key)
                out.append((cid, new))
        return out

    def resolve(self, namespace: str, ids: list[str], param: str) -> dict[str, str]:
        """``id -> store key`` for the caller's ``ids``; 404 naming ``param`` for one it does not hold."""
        if self.shared:
            return {i: i for i in ids}
        with self._lock:
            mine = self._ids.get(namespace, {})
            unknown = [i for i in ids if i not in mine]
            found = {i: mine[i] for i in ids if i in mine}
        if unknown:
            raise BadRequest(f"unknown cache id {quote(unknown[0])}: POST /v1/context_cache returns ids",
                             status=404, param=param, code="cache_id_not_found")
        return found

    def remove(self, namespace: str, cid: str) -> str | None:
        """Drop the caller's reference to ``cid``; the store key to delete when it was the last
        (shared mode: always the id itself)."""
        if self.shared:
            return cid
        key = self.resolve(namespace, [cid], "id")[cid]
        with self._lock:
            self._ids[namespace].pop(cid, None)
            self._own[namespace].discard(key)
            self._refs[key] -= 1
            if self._refs[key] > 0:
                return None
            del self._refs[key]
        return key

    def owns(self, namespace: str, key: str) -> bool:
        """Whether a prompt of ``namespace`` may link store entry ``key``."""
        with self._lock:
            return key in self._own.get(namespace, ())

    def note(self, namespace: str, keys: list[str]) -> None:
        with self._lock:
            self._own[namespace].update(keys)

    def view(self, namespace: str) -> "Namespace | None":
        """What a prompt of ``namespace`` may link from the store (None with one namespace: all)."""
        return None if self.shared else Namespace(self, namespace)


class Namespace:
    """One namespace's side of prompt matching: a prompt links a stored chunk only when the
    namespace stored it (``POST /v1/context_cache``) or compiled it on a miss; any other is a
    miss, compiled again, so nothing in an answer (``cached_tokens``, ``chunks_loaded``...)
    depends on what other namespaces stored (docs/SERVING.md, *Tenants*)."""

    def __init__(self, tenants: Tenants, name: str):
        self.tenants, self.name = tenants, name

    def owns(self, key: str) -> bool:
        return self.tenants.owns(self.name, key)

    def note(self, keys: list[str]) -> None:
        """``keys`` were compiled for this namespace (on a miss): its later prompts link them."""
        self.tenants.note(self.name, keys)
