"""A retrieved hit with its neighbours, linked from entries compiled in order (docs/RESULTS.md §39).

What ``with_neighbours(retriever, chunks, 2)`` (LangChain) or ``PrevNextNodePostprocessor``
(LlamaIndex) put in a prompt: the chunk that holds the answer with up to ``--neighbours``
chunks either side of it, in document order, behind the prompt's leading text. Each RULER 4k
prompt's document is compiled in order (``Config(compile_behind=m, compile_head=<the prompt's
instruction>)``), then the run's prompt goes through ``RagPic.generate`` three ways on the same
tokens: ``full``; ``legolink-16`` linking the entries compiled in order (a run that starts
inside its document links its first ``m`` chunks alone); ``legolink-16`` linking every chunk
alone (an engine without ``compile_behind`` on the same store). One pair of engines per task
(the task's instruction is the head), so each request after the first finds the leading text
in the engine's prefix cache, as a serving engine does; a task's first prompt runs twice, timed
the second time.

    python benchmarks/neighbour_runs.py GGUF [--tasks niah_multivalue,niah_multiquery] [--samples 4]
        [--behind 2] [--neighbours 2] [--json OUT]

(Prompts of seed 0, the evaluation's; bf16, held dense weights, 2 threads; a temporary store,
exact KV.) Each speed-up is one request's against ``full``'s: TTFT, and the whole answer (the
``generate`` call, greedy, the task's answer budget).
"""

from __future__ import annotations

import itertools
import json
import statistics
import tempfile
import time

from ragpic import Config, RagPic
from ragpic.eval.ruler import score_answer
from ragpic.eval.ruler_tasks import SYSTEM

from compile_head_engine import engine_setup, ruler_samples
from probe_ranks import ruler_parser

WAYS = ("behind", "alone")


def answered(engine: RagPic, prompt: str, run: list[str], method: str):
    """``(generation, seconds to the whole answer)``: the call timed from start to its last token."""
    t0 = time.perf_counter()
    g = engine.generate(prompt, hints=run, chat=False, method=method)
    return g, time.perf_counter() - t0


def main() -> None:
    p = ruler_parser(__doc__, "the GGUF")
    p.set_defaults(tasks="niah_multivalue,niah_multiquery", samples=4)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--behind", type=int, default=2, help="Config(compile_behind=m)")
    p.add_argument("--neighbours", type=int, default=2, help="chunks either side of the hit")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    lm, haystack, before = engine_setup(args.gguf)
    tok, rows = lm.tokenizer, []
    with tempfile.TemporaryDirectory() as store:
        engines, warm = {}, False
        for s in ruler_samples(tok, haystack, args):
            if engines.get("task") != s.task:  # one pair per task (its instruction is the head), warmed up once
                common = dict(store=store, kv_quant="none", system_prompt=SYSTEM, max_new_tokens=s.max_new_tokens)
                engines = {"task": s.task,
                           "behind": RagPic(Config(compile_behind=args.behind, compile_head=s.prefix[len(before):],
                                                   **common), lm=lm),
                           "alone": RagPic(Config(**common), lm=lm)}
                warm = True
            texts = [c.text for c in s.chunks]
            engines["behind"].compile(texts, in_order=True, separator="")
            at, ends = "".join(texts).index(s.expected[0]), list(itertools.accumulate(map(len, texts)))
            hit = next(j for j, end in enumerate(ends) if at < end)  # the chunk the answer starts in
            first, last = max(0, hit - args.neighbours), min(len(texts), hit + args.neighbours + 1)
            run = texts[first:last]
            prompt = s.prefix + "".join(run) + s.suffix
            for _ in range(2 if warm else 1):  # the first pass of a process pays one-time costs: untimed
                full, full_s = answered(engines["behind"], prompt, run, "full")
                got = {way: answered(engines[way], prompt, run, "legolink-16") for way in WAYS}
            warm = False
            row = {"task": s.task, "sample": s.index, "hit": hit, "run": [first, last], "full": score_answer(s, full.text),
                   "prompt_tokens": full.prompt_tokens, "full_ttft_s": full.ttft_s, "full_answer_s": full_s,
                   "full_tokens": len(full.token_ids)}
            for way, (g, answer_s) in got.items():
                row[way] = {"score": score_answer(s, g.text), "same": g.token_ids == full.token_ids,
                            "chunks_loaded": g.chunks_loaded, "chunks_behind": g.chunks_behind,
                            "recomputed": g.recomputed_tokens, "ttft_s": g.ttft_s, "speedup": full.ttft_s / g.ttft_s,
                            "answer_s": answer_s, "answer_speedup": full_s / answer_s, "tokens": len(g.token_ids)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    total = sum(r["full"] for r in rows)
    for way in WAYS:
        print(f"{way}: {sum(r[way]['score'] for r in rows) / total:.0%} of full's score, "
              f"{sum(r[way]['same'] for r in rows)}/{len(rows)} answers full's token for token, "
              f"chunks behind {sum(r[way]['chunks_behind'] for r in rows)}/{sum(r['run'][1] - r['run'][0] for r in rows)}, "
              f"median TTFT speed-up {statistics.median(r[way]['speedup'] for r in rows):.1f}x, "
              f"median whole-answer speed-up {statistics.median(r[way]['answer_speedup'] for r in rows):.1f}x")
    print(f"medians: full TTFT {statistics.median(r['full_ttft_s'] for r in rows):.2f} s, whole answer "
          f"{statistics.median(r['full_answer_s'] for r in rows):.2f} s; " + "; ".join(
              f"{way} {statistics.median(r[way]['ttft_s'] for r in rows):.2f} s, "
              f"{statistics.median(r[way]['answer_s'] for r in rows):.2f} s" for way in WAYS))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
