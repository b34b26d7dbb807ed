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

from ragpic.errors import ConfigError
from ragpic.serve.bodies import BadRequest, quote

__all__ = ["Namespace", "Tenants", "read_keys_file"]


MIN_KEY_CHARS = 16  # shorter is guessable, and is likely a namespace label in the key's column


def _bad(path, n: int, why: str) -> ConfigError:
    return ConfigError(f"{path}: line {n}: {why}")


def read_keys_file(path: str | Path) -> dict[str, str]:
    """``key -> namespace`` from a file of ``NAMESPACE KEY`` lines (``#`` comments, blank lines).

    Checked whole before use, so a swapped file (``KEY NAMESPACE``) cannot make namespace
    labels valid keys: two columns a line, each key once, at least :data:`MIN_KEY_CHARS`
    characters and no namespace's name. A bad file raises :class:`ConfigError` naming the
    file and line (it never quotes a key that could be real: only short ones)."""
    keys: dict[str, str] = {}
    key_line: dict[str, int] = {}
    namespace_line: dict[str, int] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise _bad(path, n, f"expected 'NAMESPACE KEY', got {len(parts)} fields")
        namespace, key = parts
        if len(key) < MIN_KEY_CHARS:
            swapped = "; did you swap them?" if len(namespace) >= MIN_KEY_CHARS else ""
            raise _bad(path, n, f"key {key!r} is shorter than {MIN_KEY_CHARS} characters — lines are "
                                f"NAMESPACE KEY{swapped} (make keys long and random, e.g. `openssl rand -hex 16`)")
        if key in key_line:
            raise _bad(path, n, f"the key of line {key_line[key]} is repeated: give every key its own "
                                f"line, once (several keys may share a namespace)")
        keys[key], key_line[key] = namespace, n
        namespace_line.setdefault(namespace, n)
    for key, n in key_line.items():
        if key in namespace_line:
            raise _bad(path, n, f"its key is also the namespace of line {namespace_line[key]} — lines are "
                                f"NAMESPACE KEY; did you swap them?")
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
        """The caller's namespace from its ``Authorization`` header (``Bearer KEY``, the scheme in
        any case), or None (not allowed)."""
        if not self.keys:
            return ""
        scheme, _, credentials = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":  # auth schemes are case-insensitive (RFC 7235 section 2.1)
            return None
        return self.keys.get(credentials.lstrip(" "))

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
