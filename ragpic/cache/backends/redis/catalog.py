"""RedisCatalog: a Redis store's catalog calls, over the hash ``p + "catalog:" + fp``
(``key -> chunk text``) and its anchor rows (:mod:`.text`); see
:mod:`.backend` for the keys and for the transaction that writes a row with its entry.

A mixin of :class:`~ragpic.cache.backends.redis.backend.RedisBackend` (it uses its client
``_r``, ``cluster``, ``_catalog``, ``_text``, ``_text_ready`` and ``contains_many``), as
:class:`~ragpic.cache.backends.disk.catalog.FolderCatalog` is of the folder store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ragpic.cache.format.anchors import Posting


class RedisCatalog:
    """The catalog half of :class:`~ragpic.cache.backends.redis.backend.RedisBackend`."""

    def catalog(self, fingerprint: str) -> dict[str, str]:
        """``key -> text`` for this fingerprint's entries that are stored (payload and meta)."""
        raw = self._r.hgetall(self._catalog(fingerprint))
        rows = {k.decode(): v.decode("utf-8") for k, v in raw.items()}
        keys = list(rows)
        present: set[str] = set()
        for i in range(0, len(keys), 1000):
            batch = keys[i : i + 1000]
            present.update(k for k, hit in zip(batch, self.contains_many(batch)) if hit)
        stale = [k for k in keys if k not in present]
        if stale:
            self.catalog_remove(fingerprint, stale)
        return {k: t for k, t in rows.items() if k in present}

    def catalog_add(self, fingerprint: str, items: Mapping[str, str]) -> None:
        """Catalog rows and their anchor rows, in one transaction (a repair)."""
        if items:
            pipe, later = self._r.pipeline(transaction=not self.cluster), []
            pipe.hset(self._catalog(fingerprint), mapping=dict(items))
            self._text.queue_add(pipe, fingerprint, items, later)
            pipe.execute()
            self._text.run_later(later, self._r)

    def catalog_remove(self, fingerprint: str, keys: Sequence[str]) -> None:
        if keys:
            pipe, later = self._r.pipeline(transaction=not self.cluster), []
            self._queue_remove(pipe, fingerprint, keys, later)
            pipe.execute()
            self._text.run_later(later, self._r)

    def _queue_remove(self, pipe, fingerprint: str, keys: Sequence[str], later: list) -> None:
        pipe.hdel(self._catalog(fingerprint), *keys)
        self._text.queue_remove(pipe, fingerprint, keys, later)

    def catalog_has(self, fingerprint: str, keys: Sequence[str]) -> list[bool]:
        """Whether each key has a catalog row: HEXISTS per key, one pipelined round trip per
        1,000 keys (the catalog is one hash, so one slot on a cluster)."""
        out: list[bool] = []
        for lo in range(0, len(keys), 1000):
            pipe = self._r.pipeline(transaction=False)
            for key in keys[lo:lo + 1000]:
                pipe.hexists(self._catalog(fingerprint), key)
            out.extend(bool(hit) for hit in pipe.execute())
        return out

    def catalog_texts(self, fingerprint: str, keys: Sequence[str]) -> dict[str, str]:
        if not keys:
            return {}
        raw = self._r.hmget(self._catalog(fingerprint), list(keys))
        return {k: v.decode("utf-8") for k, v in zip(keys, raw) if v is not None}

    def anchor_lookup(self, fingerprint: str, anchors: Sequence[str]) -> dict[str, list[Posting]]:
        self._text_rows_of(fingerprint)
        return self._text.lookup(fingerprint, anchors)

    def short_lengths(self, fingerprint: str) -> set[int]:
        self._text_rows_of(fingerprint)
        return self._text.short_lengths(fingerprint)

    def _text_rows_of(self, fingerprint: str) -> None:
        """A catalog written by an older ragpic (rows without anchors) gets its anchor rows
        once per server, O(catalog); every later write keeps them with the rows."""
        if fingerprint not in self._text_ready:
            self._text.fill_once(fingerprint, self._catalog(fingerprint))
            self._text_ready.add(fingerprint)
