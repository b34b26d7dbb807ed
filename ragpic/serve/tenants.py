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
namespace stored a text. The records (ids, references, what each namespace may link) live
where the store lives (:mod:`.tenant_records`): in Redis or a folder store every replica of
the store shares them and a restart keeps them; a memory-only store keeps them in this
process (docs/SERVING.md, *Tenants*).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from ragpic.errors import ConfigError, StoreError
from ragpic.serve.bodies import BadRequest, quote
from ragpic.serve.tenant_records import MemoryRecords, TenantRecords

__all__ = ["Namespace", "Tenants", "read_keys_file"]

log = logging.getLogger("ragpic.serve")


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
    """``keys``: API key -> namespace (empty: no key needed, one namespace); ``records``: where
    the namespaces' ids live (:func:`~ragpic.serve.tenant_records.records_for` the server's
    store; default: this process). Calls that reach ``records`` may block on the store's
    medium: the routes run them off the event loop."""

    def __init__(self, keys: dict[str, str] | None = None, records: TenantRecords | None = None):
        self.keys = dict(keys or {})
        self.shared = len(set(self.keys.values())) <= 1
        self.records: TenantRecords = records if records is not None else MemoryRecords()

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
        # a function of (namespace, key) only: every replica names an entry alike for a namespace
        return "cc-" + hashlib.sha256(f"{namespace}\0{key}".encode()).hexdigest()[:48]

    def add(self, namespace: str, keys: list[str], stored_before: list[bool]) -> list[tuple[str, bool]]:
        """Register store ``keys`` in ``namespace``: ``(id, new)`` each (``new``: compiled for
        the caller; shared mode: not in the store before)."""
        if self.shared:
            return [(k, not hit) for k, hit in zip(keys, stored_before)]
        pairs = [(self._id(namespace, k), k) for k in keys]
        return [(cid, new) for (cid, _), new in zip(pairs, self.records.add(namespace, pairs))]

    def resolve(self, namespace: str, ids: list[str], param: str) -> dict[str, str]:
        """``id -> store key`` for the caller's ``ids``; 404 naming ``param`` for one it does not
        hold (the same answer for another namespace's id as for one never made: no leak)."""
        if self.shared:
            return {i: i for i in ids}
        found = self.records.lookup(namespace, ids)
        unknown = [i for i in ids if i not in found]
        if unknown:
            raise _unknown(unknown[0], param)
        return found

    def remove(self, namespace: str, cid: str) -> str | None:
        """Drop the caller's reference to ``cid``; the store key to delete when it was the last
        (shared mode: always the id itself)."""
        if self.shared:
            return cid
        key = self.resolve(namespace, [cid], "id")[cid]
        left = self.records.remove(namespace, cid, key)
        if left is None:  # another replica removed it between the two calls
            raise _unknown(cid, "id")
        return key if left == 0 else None

    def owns(self, namespace: str, key: str) -> bool:
        """Whether a prompt of ``namespace`` may link store entry ``key`` (records that cannot be
        read answer no: the chunk is a miss, compiled again, never another namespace's)."""
        try:
            return self.records.owns(namespace, [key])[0]
        except StoreError as exc:
            log.warning("%s: the chunk is compiled as a miss", exc)
            return False

    def note(self, namespace: str, keys: list[str]) -> None:
        try:
            self.records.note(namespace, keys)
        except StoreError as exc:  # the answer stands; its next prompts compile these again
            log.warning("%s: compiled chunks not recorded for their namespace", exc)

    def view(self, namespace: str) -> "Namespace | None":
        """What a prompt of ``namespace`` may link from the store (None with one namespace: all)."""
        return None if self.shared else Namespace(self, namespace)

    def close(self) -> None:
        self.records.close()


def _unknown(cid: str, param: str) -> BadRequest:
    return BadRequest(f"unknown cache id {quote(cid)}: POST /v1/context_cache returns ids",
                      status=404, param=param, code="cache_id_not_found")


class Namespace:
    """One namespace's side of prompt matching: a prompt links a stored chunk only when the
    namespace stored it (``POST /v1/context_cache``) or compiled it on a miss; any other is a
    miss, compiled again, so nothing in an answer (``cached_tokens``, ``chunks_loaded``...)
    depends on what other namespaces stored (docs/SERVING.md, *Tenants*). One per request: it
    remembers its answers, so a chunk costs one read of the records per request."""

    def __init__(self, tenants: Tenants, name: str):
        self.tenants, self.name = tenants, name
        self._seen: dict[str, bool] = {}

    def owns(self, key: str) -> bool:
        if key not in self._seen:
            self._seen[key] = self.tenants.owns(self.name, key)
        return self._seen[key]

    def note(self, keys: list[str]) -> None:
        """``keys`` were compiled for this namespace (on a miss): its later prompts link them."""
        self.tenants.note(self.name, keys)
        self._seen.update(dict.fromkeys(keys, True))
