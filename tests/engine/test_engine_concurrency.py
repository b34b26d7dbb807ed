"""A slow store delays only the request that waits on it: store calls run outside the
engine's step lock, so other streams keep getting tokens."""

from __future__ import annotations

import threading
import time

from ragpic import Config, RagPic
from ragpic.cache.backends import MemoryBackend
from ragpic.cache.store import ChunkStore
from tiny import tiny_lm

PASSAGE = "the quick brown fox jumps over the lazy dog near the park."
DELAY = 1.5


class SlowMemory(MemoryBackend):
    """The in-process backend with a slow medium (a stalled disk or network) when ``slow`` is set."""

    slow = False

    def get_many(self, keys):
        if self.slow:
            time.sleep(DELAY)
        return super().get_many(keys)


def test_a_stalled_store_lookup_never_holds_up_other_streams():
    lm = tiny_lm("llama", num_hidden_layers=2)
    lm.model.generation_config.eos_token_id = None
    backend = SlowMemory(1 << 30)
    store = ChunkStore(backend, fingerprint=lm.fingerprint, memory_bytes=0)  # every lookup hits the backend
    engine = RagPic(Config(store=None, max_new_tokens=40), lm=lm, store=store)
    engine.compile([PASSAGE])
    running = iter(engine.stream("question: what is the best thing to do?"))
    next(running)  # this stream is linked and decoding
    backend.slow = True
    waiting = threading.Thread(target=engine.generate, args=(f"context: {PASSAGE} question: what?",),
                               kwargs={"max_new_tokens": 2})
    waiting.start()
    time.sleep(0.2)  # the other request is now inside its store lookup
    t0 = time.perf_counter()
    for _ in range(5):
        next(running)
    took = time.perf_counter() - t0
    waiting.join()
    assert took < DELAY / 2, f"5 tokens of another stream took {took:.2f} s while a store lookup stalled"
