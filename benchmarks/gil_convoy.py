"""How much a Python-busy thread slows the model thread's decode step (CPython's GIL).

    python benchmarks/gil_convoy.py --threads 2

A server's model thread releases the GIL inside each torch op and must take it back after;
while another thread runs pure Python, taking it back waits for that thread's switch
interval (5 ms by default). Times one decode step of the embedded model over a cache of
``--context`` tokens alone, beside a Python-busy thread, and beside it with a 0.5 ms switch
interval (docs/SERVING.md, *Measured*). Best of 3 runs of 10 steps each.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import torch
from transformers.cache_utils import DynamicCache

from ragpic import Config, RagPic


def step_ms(model, cache: DynamicCache, token: torch.Tensor, steps: int = 10) -> float:
    """Mean ms of one decode forward over ``cache`` (the step's row is cropped off after each)."""
    t = time.perf_counter()
    for _ in range(steps):
        model(input_ids=token, past_key_values=cache, use_cache=True)
        cache.crop(-1)
    return (time.perf_counter() - t) / steps * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--context", type=int, default=1500, help="tokens in the cache")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = RagPic(Config(store=None, device="cpu")).lm.model
    ids = torch.randint(0, 1000, (1, args.context), generator=torch.Generator().manual_seed(0))
    stop = threading.Event()

    def busy() -> None:  # pure Python: holds the GIL except when the interpreter hands it over
        while not stop.is_set():
            sum(range(1000))

    default = sys.getswitchinterval()
    with torch.inference_mode():
        cache = DynamicCache()
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        step_ms(model, cache, ids[:, :1])  # warm-up
        print(f"decode step alone: {min(step_ms(model, cache, ids[:, :1]) for _ in range(3)):.1f} ms")
        thread = threading.Thread(target=busy, daemon=True)
        thread.start()
        try:
            print(f"beside a Python-busy thread: {min(step_ms(model, cache, ids[:, :1]) for _ in range(3)):.1f} ms "
                  f"(switch interval {default * 1000:g} ms)")
            sys.setswitchinterval(0.0005)
            print(f"beside it, switch interval 0.5 ms: {min(step_ms(model, cache, ids[:, :1]) for _ in range(3)):.1f} ms")
        finally:
            sys.setswitchinterval(default)
            stop.set()
            thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
