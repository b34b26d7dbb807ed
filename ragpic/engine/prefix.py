"""The prompt's leading text, linked from the KV an earlier link computed for it
(docs/ARCHITECTURE.md §4.10).

Every prompt a RAG application sends starts with the same text: the chat template, the system
prompt, the instruction before the context. Nothing precedes those tokens, so the KV a link
computes for them is ``full``'s, under every method and recipe: it can be kept and linked into
the next prompt that starts with the same ids, as a chunk at position 0 that no method
recomputes. That is prefix caching (vLLM's automatic prefix caching, for the one prefix a
position-independent cache leaves shared) and it is exact: the next link's rows attend to the
same KV they would have computed.

:class:`PrefixCache` keeps the leading text segment's rows of finished links (:meth:`keep`),
keyed by their token ids, and puts them back in front of later prompts (:meth:`apply`). It is
an object its owner passes (the engine holds one; each evaluation run makes its own), never a
global, and bounded by tokens, least recently used first out.

Entries are also keyed by a salt (vLLM's ``cache_salt``): a prompt links only leading text that
a request with the same salt kept. A server passes each namespace's name, so neither
``cached_tokens`` nor the link time tells one tenant what system prompt another sent
(docs/SERVING.md, *Tenants*).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import torch

from ragpic.core.kv import ChunkKV
from ragpic.core.link import LinkResult, Linker
from ragpic.core.segments import Segment, chunk_segment

__all__ = ["PrefixCache"]


class PrefixCache:
    """Exact KV of leading prompt text, by token ids, bounded by ``max_tokens``.

    Args:
        fingerprint: the model whose links fill it (entries carry it, as compiled chunks do).
        max_tokens: most token rows held over all entries (0: nothing is kept). A 1.5B model's
            row is 28 KiB in bf16, so the default 8192 rows are ~230 MiB at most.
        min_tokens: shorter leading texts are not worth an entry.

    Thread-safe: a server's request threads plan against it while its model thread fills it.
    """

    def __init__(self, fingerprint: str, max_tokens: int = 8192, min_tokens: int = 8):
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0 (0 keeps nothing), got {max_tokens}")
        self.fingerprint, self.max_tokens, self.min_tokens = fingerprint, max_tokens, min_tokens
        # (salt, token ids) -> ((L, H, n, D) keys, values)
        self._entries: OrderedDict[tuple[str, tuple[int, ...]], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        """Token rows held."""
        return self._tokens

    @staticmethod
    def _leading(segments: Sequence[Segment]) -> Segment | None:
        """The leading text segment worth caching: text, followed by more of the prompt (the
        last row's logits start the answer, so a prompt that is all text has nothing to skip)."""
        if len(segments) < 2 or segments[0].is_chunk:
            return None
        return segments[0]

    @staticmethod
    def _key(lead: Segment, salt: str) -> tuple[str, tuple[int, ...]]:
        if not isinstance(salt, str):
            raise TypeError(f"salt must be a string (a namespace's name, or \"\"), got {type(salt).__name__}")
        return salt, tuple(lead.token_ids.tolist())

    def apply(self, segments: Sequence[Segment], linker: Linker, salt: str = "") -> list[Segment]:
        """``segments`` with the leading text replaced by its kept KV when there is an entry for
        its ids under ``salt`` and ``linker`` reads cached rows (not ``full``, which recomputes
        every row, nor a method with ``prefix_ok`` False); otherwise ``segments`` as they are.

        The replacement is a chunk segment at position 0 with the same ids and text, labelled
        with ``linker``'s recipe: its KV is the rows a causal forward computes there, which no
        recipe changes (a ``bos<N>`` recipe's dummy tokens are a compile-time device for chunks
        that start later).
        """
        segments = list(segments)
        lead = self._leading(segments)
        if lead is None or linker.every_row or not linker.prefix_ok:
            return segments
        key = self._key(lead, salt)
        with self._lock:
            kv = self._entries.get(key)
            if kv is None:
                self.misses += 1
                return segments
            self._entries.move_to_end(key)
            self.hits += 1
        keys, values = kv
        segments[0] = chunk_segment(ChunkKV(token_ids=lead.token_ids, keys=keys, values=values, base_position=0,
                                            fingerprint=self.fingerprint, recipe=linker.recipe), lead.text)
        return segments

    def keep(self, segments: Sequence[Segment], result: LinkResult, salt: str = "") -> bool:
        """Keep the leading text's rows of a finished link (a copy: the cache's memory goes back
        to its pool). Returns whether an entry was added.

        ``segments``: the linked prompt; ``result``: its link; ``salt``: only prompts planned
        with the same salt link the entry. Only a leading *text* segment is
        kept (a chunk there was linked from KV already), only rows the link wrote fresh, and
        only while ``max_tokens`` allows: the least recently used entries make room.
        """
        lead = self._leading(segments)
        if lead is None or not self.min_tokens <= lead.num_tokens <= self.max_tokens:
            return False
        n = lead.num_tokens
        if result.rows is not None and not bool(result.rows[:n].all()):
            return False  # a method that left leading rows stale (none does today): not full's rows
        key = self._key(lead, salt)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return False
        keys, values = (t.clone() for t in result.cache.rows(0, n))
        with self._lock:
            if key in self._entries:
                return False
            while self._tokens + n > self.max_tokens:
                _, (k, _) = self._entries.popitem(last=False)
                self._tokens -= k.shape[2]
            self._entries[key] = (keys, values)
            self._tokens += n
        return True

    def clear(self) -> None:
        """Drop every entry (the hit and miss counts stay)."""
        with self._lock:
            self._entries.clear()
            self._tokens = 0
