"""How much an idle OpenMP thread team in another thread slows the model thread's forwards.

    python benchmarks/omp_teams.py [--tokens 256] [--runs 5] [--rounds 3]

An ATen op large enough to run in parallel, called from a thread, gives that thread an OpenMP
team of its own that lives as long as the thread. With more OpenMP threads than cores, libgomp
stops spinning between parallel regions, so every region of the model thread pays a wake-up:
the reason the server keeps all tensor work on its model thread (docs/ARCHITECTURE.md §4.7).
Times a prefill forward of the embedded model over ``--tokens`` tokens on this thread, alone
and while another live (idle) thread holds a team, alternated for ``--rounds``; medians.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

from ragpic import Config, RagPic


def forward_ms(model, ids: torch.Tensor, runs: int) -> float:
    """Median ms of ``runs`` forwards of ``model`` over ``ids`` ``(1, T)`` int64 (after one warm-up)."""
    times = []
    for i in range(runs + 1):
        t = time.perf_counter()
        model(input_ids=ids, use_cache=False)
        if i:
            times.append(1000 * (time.perf_counter() - t))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5, help="forwards per measurement (median)")
    ap.add_argument("--rounds", type=int, default=3, help="alternated alone / beside measurements")
    args = ap.parse_args(argv)
    lm = RagPic(Config(store=None, device="cpu")).lm
    ids = torch.randint(100, 1000, (1, args.tokens))
    print(f"{lm.name}, {args.tokens}-token forward, torch threads {torch.get_num_threads()}, "
          f"CPU {torch.backends.cpu.get_cpu_capability()}", flush=True)
    with torch.inference_mode():
        alone, beside = [], []
        for r in range(args.rounds):  # alternated: drift on the machine hits both alike
            alone.append(forward_ms(lm.model, ids, args.runs))
            release = threading.Event()

            def other() -> None:
                (torch.ones(4_000_000) * 2).sum()  # one parallel region: this thread now has a team
                release.wait()

            t = threading.Thread(target=other, name="other-team")
            t.start()
            time.sleep(0.5)
            beside.append(forward_ms(lm.model, ids, args.runs))
            release.set()
            t.join()
            print(f"round {r + 1}: alone {alone[-1]:.1f} ms, another live thread holds an OpenMP team "
                  f"{beside[-1]:.1f} ms", flush=True)
    a, b = statistics.median(alone), statistics.median(beside)
    print(f"median: alone {a:.1f} ms, beside {b:.1f} ms ({b / a:.2f}x)")


if __name__ == "__main__":
    main()
