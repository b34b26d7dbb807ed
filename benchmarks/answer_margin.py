"""Where a method's greedy answer parts from ``full``'s on one needle cell, and by how much
``full`` itself preferred its token there (docs/RESULTS.md §33).

Runs ``full`` and each method on the cell's prompt as ``ragpic eval needle`` does (the same
chunks, variants and prefix cache), teacher-forces every method on ``full``'s answer, and
reports per method: the first answer token where the greedy answers differ, ``full``'s top two
tokens there with their log-probability gap, the method's, and the KL(full || method) at that
step. A gap of a few hundredths of a nat is a near tie: any change to the KV may flip it.

    python benchmarks/answer_margin.py GGUF --length 4096 --depth 0.5 \\
        --methods qr-2-k4-h1-w-s@prev4,qr-2-k4-h1-w-s@head@prev4 [--json OUT]

(bf16, held dense weights, 2 threads).
"""

from __future__ import annotations

import argparse
import json

import torch

from ragpic.core.model import load_model
from ragpic.eval.data import default_haystack, load_haystack
from ragpic.eval.evaluate import run_methods
from ragpic.eval.needle import needle_chunks
from ragpic.eval.variants import compile_for, head_ids, normalize_methods, prompt_segments


def top2(tok, logprobs: torch.Tensor) -> list[tuple[str, float]]:
    v, i = logprobs.topk(2)
    return [(tok.decode([int(t)]), round(float(x), 4)) for x, t in zip(v, i)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("gguf")
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--depth", type=float, default=0.5)
    p.add_argument("--methods", required=True)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(2)
    lm = load_model(args.gguf, device="cpu", dtype="bfloat16", hold_dense=True)
    tok = lm.tokenizer
    prefix, texts, suffix = needle_chunks(tok, load_haystack(default_haystack()), args.length, args.depth)
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    methods = normalize_methods(args.methods, ())
    kvs = compile_for(lm, ids, methods, {}, head=head_ids(tok, prefix))
    segs = {r: prompt_segments(tok, prefix, kv, suffix, glue=None) for r, kv in kvs.items()}
    runs = run_methods(lm, segs, methods, args.max_new_tokens)
    full = runs["full"]
    full_lp = full.tf_logits.log_softmax(-1)
    out = []
    for m in methods[1:]:
        run = runs[m]
        lp = run.tf_logits.log_softmax(-1)
        at = next((i for i, (a, b) in enumerate(zip(full.answer_ids, run.answer_ids)) if a != b), None)
        row = {"method": m, "answer": run.answer, "full_answer": full.answer, "parts_at": at}
        if at is not None:
            f2, m2 = top2(tok, full_lp[at]), top2(tok, lp[at])
            row.update(full_top2=f2, full_gap=round(f2[0][1] - f2[1][1], 4), method_top2=m2,
                       method_gap=round(m2[0][1] - m2[1][1], 4),
                       kl_there=round(float((full_lp[at].exp() * (full_lp[at] - lp[at])).sum()), 5),
                       common=tok.decode(full.answer_ids[:at]))
        out.append(row)
        print(json.dumps(row, ensure_ascii=False))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"length": args.length, "depth": args.depth, "rows": out}, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
