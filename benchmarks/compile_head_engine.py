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

import argparse
import json
import tempfile

import torch

from ragpic import Config, RagPic
from ragpic.core.model import load_model
from ragpic.eval.data import default_haystack, load_haystack, template_parts
from ragpic.eval.ruler import score_answer
from ragpic.eval.ruler_tasks import SYSTEM, generate_sample


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("gguf")
    p.add_argument("--tasks", default="niah_multivalue,cwe")
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(2)
    lm = load_model(args.gguf, device="cpu", dtype="bfloat16", hold_dense=True)
    tok, haystack, rows = lm.tokenizer, load_haystack(default_haystack()), []
    before = template_parts(tok, SYSTEM)[0]  # the chat opening the engine puts first with this system prompt
    with tempfile.TemporaryDirectory() as store:
        for task in args.tasks.split(","):
            for i in range(args.samples):
                s = generate_sample(tok, haystack, task, args.length, i)
                engine = RagPic(Config(store=store, compile_behind=4, compile_head=s.prefix[len(before):],
                                       kv_quant="none", system_prompt=SYSTEM, max_new_tokens=s.max_new_tokens), lm=lm)
                assert engine.compile_head_ids() == tok(s.prefix, add_special_tokens=False)["input_ids"], task
                texts = [c.text for c in s.chunks]
                engine.compile(texts, in_order=True, separator="")
                prompt = s.prefix + "".join(texts) + s.suffix
                full = engine.generate(prompt, hints=texts, chat=False, method="full")
                linked = engine.generate(prompt, hints=texts, chat=False, method="legolink-16")
                row = {"task": task, "sample": i, "chunks": len(texts), "behind": linked.chunks_behind,
                       "full": score_answer(s, full.text), "legolink-16": score_answer(s, linked.text),
                       "same": full.token_ids == linked.token_ids, "speedup": full.ttft_s / linked.ttft_s}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
