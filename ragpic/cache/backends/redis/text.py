"""The text-index half of a Redis store's catalog (see :mod:`.backend`).

Keys, for prefix ``p`` and fingerprint ``fp``, beside the catalog hash ``p + "catalog:" + fp``
(``key -> text``, which is also where texts are read by key)::

    p + "tidx:" + fp + ":a"          hash  anchor -> "key|len|digest;key|len|digest..."
    p + "tidx:" + fp + ":k"          hash  key -> anchor            (for removal)
    p + "tidx:" + fp + ":s"          set   lengths of short chunks
    p + "tidx:" + fp + ":catalogued" marker: the rows were filled from the catalog once

Rows are queued on the caller's pipeline: on a standalone server that is the ``MULTI`` that
writes the entries' meta keys and catalog rows (or deletes them), so a chunk's text matches
exactly while its entry is catalogued. Postings of one anchor are appended by a Lua script,
so two workers storing chunks with the same first characters cannot lose one another's row;
a cluster pipeline refuses scripts, so there they run after it, on the node of the hash.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ragpic.cache.format.anchors import ANCHOR, Posting, posting_of

_APPEND = """
for i = 1, #ARGV, 2 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  if not cur then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  elseif not string.find(';' .. cur .. ';', ';' .. ARGV[i + 1] .. ';', 1, true) then
    redis.call('HSET', KEYS[1], ARGV[i], cur .. ';' .. ARGV[i + 1])
  end
end
"""
_DROP = """
for i = 1, #ARGV, 2 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  if cur then
    local kept = {}
    for p in string.gmatch(cur, '[^;]+') do
      if string.sub(p, 1, #ARGV[i + 1] + 1) ~= ARGV[i + 1] .. '|' then table.insert(kept, p) end
    end
    if #kept == 0 then redis.call('HDEL', KEYS[1], ARGV[i]) else redis.call('HSET', KEYS[1], ARGV[i], table.concat(kept, ';')) end
  end
end
"""


class RedisTextRows:
    """Anchor rows of every fingerprint under one prefix, on one client."""

    def __init__(self, client, prefix: str, cluster: bool) -> None:
        self._r, self._prefix, self._cluster = client, prefix, cluster
        self._append = client.register_script(_APPEND)
        self._drop = client.register_script(_DROP)

    def _key(self, fingerprint: str, part: str) -> str:
        return f"{self._prefix}tidx:{fingerprint}:{part}"

    def _script(self, script, pipe, key: str, args: list[str], later: list) -> None:
        if not args:
            return
        if self._cluster:
            later.append((script, key, args))
        else:
            script(keys=[key], args=args, client=pipe)

    def queue_add(self, pipe, fingerprint: str, items: Mapping[str, str], later: list) -> None:
        """Queue the rows of ``key -> text`` on ``pipe`` (scripts a cluster cannot pipeline go
        to ``later``: run them with :meth:`run_later` after the pipeline)."""
        if not items:
            return
        rows = [posting_of(k, t) for k, t in items.items()]
        pipe.hset(self._key(fingerprint, "k"), mapping={p.key: a for a, p in rows})
        shorts = {p.length for _, p in rows if p.length < ANCHOR}
        if shorts:
            pipe.sadd(self._key(fingerprint, "s"), *shorts)
        self._script(self._append, pipe, self._key(fingerprint, "a"),
                     [x for a, p in rows for x in (a, p.encode())], later)

    def queue_remove(self, pipe, fingerprint: str, keys: Sequence[str], later: list) -> None:
        """Queue the removal of ``keys``' rows (their anchors are read first, outside ``pipe``)."""
        if not keys:
            return
        anchors = self._r.hmget(self._key(fingerprint, "k"), list(keys))
        pairs = [x for k, a in zip(keys, anchors) if a is not None for x in (a.decode(), k)]
        self._script(self._drop, pipe, self._key(fingerprint, "a"), pairs, later)
        pipe.hdel(self._key(fingerprint, "k"), *keys)

    @staticmethod
    def run_later(later: list, client) -> None:
        for script, key, args in later:
            script(keys=[key], args=args, client=client)

    def lookup(self, fingerprint: str, anchors: Sequence[str]) -> dict[str, list[Posting]]:
        if not anchors:
            return {}
        raw = self._r.hmget(self._key(fingerprint, "a"), list(anchors))
        return {a: [Posting.decode(p) for p in v.decode().split(";")] for a, v in zip(anchors, raw) if v}

    def short_lengths(self, fingerprint: str) -> set[int]:
        return {int(n) for n in self._r.smembers(self._key(fingerprint, "s"))}

    def catalogued(self, fingerprint: str) -> bool:
        return bool(self._r.exists(self._key(fingerprint, "catalogued")))

    def mark_catalogued(self, fingerprint: str) -> None:
        self._r.set(self._key(fingerprint, "catalogued"), "1")

    def fill_once(self, fingerprint: str, catalog: str) -> None:
        """Anchor rows for every row of the ``catalog`` hash, unless this server has them
        (its marker): a catalog an older ragpic wrote, O(catalog), once per server."""
        if self.catalogued(fingerprint):
            return
        cursor, later = 0, []
        while True:
            cursor, raw = self._r.hscan(catalog, cursor, count=2048)
            pipe = self._r.pipeline(transaction=False)
            self.queue_add(pipe, fingerprint, {k.decode(): v.decode("utf-8") for k, v in raw.items()}, later)
            pipe.execute()
            if not cursor:
                break
        self.run_later(later, self._r)
        self.mark_catalogued(fingerprint)
