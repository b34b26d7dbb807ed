"""The library's own path for RULER prompts compiled in order (docs/RESULTS.md §33): each
prompt's chunks stored with ``RagPic.compile(texts, in_order=True)`` under
``Config(compile_behind=4, compile_head=<the prompt's instruction>)``, then the whole prompt
through ``RagPic.generate`` with ``legolink-16``, beside ``full`` through the same engine. It
checks that the engine links what ``ragpic eval ruler``'s ``legolink-16@head@prev4`` measured:
every chunk from an entry behind the leading text, and the same scores.

    python benchmarks/compile_head_engine.py GGUF [--tasks niah_multivalue,cwe] [--samples 2] [--json OUT]

(4k prompts of seed 0, the evaluation's; bf16, held dense weights, 2 threads; the store is a
temporary folder, exact KV: ``kv_quant="none"``.)
"""

from __future__ import annotations

import json
import tempfile

import torch

from ragpic import Config, RagPic
from ragpic.core.model import load_model
from ragpic.eval.data import default_haystack, load_haystack, template_parts
from ragpic.eval.ruler import score_answer
from ragpic.eval.ruler_tasks import SYSTEM, generate_sample

from probe_ranks import ruler_parser


def engine_setup(gguf: str):
    """``(lm, haystack, before)``: the model as the evaluations load it (bf16, held dense weights,
    2 threads), the bundled haystack, and the chat opening the engine puts before a RULER
    prompt's instruction under its system prompt."""
    torch.set_num_threads(2)
    lm = load_model(gguf, device="cpu", dtype="bfloat16", hold_dense=True)
    return lm, load_haystack(default_haystack()), template_parts(lm.tokenizer, SYSTEM)[0]


def ruler_samples(tok, haystack, args):
    """The prompts ``args`` asks for: ``--samples`` of each of ``--tasks``, ``--length`` tokens, ``--seed``."""
    for task in args.tasks.split(","):
        for i in range(args.samples):
            yield generate_sample(tok, haystack, task, args.length, i, seed=args.seed)


def main() -> None:
    p = ruler_parser(__doc__, "the GGUF")
    p.set_defaults(tasks="niah_multivalue,cwe", samples=2)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    lm, haystack, before = engine_setup(args.gguf)
    tok, rows = lm.tokenizer, []
    with tempfile.TemporaryDirectory() as store:
        for s in ruler_samples(tok, haystack, args):
            engine = RagPic(Config(store=store, compile_behind=4, compile_head=s.prefix[len(before):],
                                   kv_quant="none", system_prompt=SYSTEM, max_new_tokens=s.max_new_tokens), lm=lm)
            assert engine.compile_head_ids() == tok(s.prefix, add_special_tokens=False)["input_ids"], s.task
            texts = [c.text for c in s.chunks]
            engine.compile(texts, in_order=True, separator="")
            prompt = s.prefix + "".join(texts) + s.suffix
            full = engine.generate(prompt, hints=texts, chat=False, method="full")
            linked = engine.generate(prompt, hints=texts, chat=False, method="legolink-16")
            row = {"task": s.task, "sample": s.index, "chunks": len(texts), "behind": linked.chunks_behind,
                   "full": score_answer(s, full.text), "legolink-16": score_answer(s, linked.text),
                   "same": full.token_ids == linked.token_ids, "speedup": full.ttft_s / linked.ttft_s}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
