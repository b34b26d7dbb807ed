"""What compiling a document in order costs at ingest (docs/RESULTS.md §37): one long document
cut into 512-token chunks, stored with ``RagPic.compile(texts)`` (each chunk alone) and with
``RagPic.compile(texts, in_order=True)`` under ``Config(compile_behind=m, compile_head=...)``
for each ``m`` (each chunk alone and behind the leading text and its ``m`` predecessors), each
into a fresh in-memory store, beside one ``full`` prefill of the whole prompt (what a request
without any stored KV pays once). Same model, same token ids, one process, nothing else running.

    python benchmarks/in_order_ingest.py GGUF [--tokens 8192] [--behind 2,4,8] [--json OUT]

(bf16, held dense weights, 2 threads; the bundled essays as the document.)
"""

from __future__ import annotations

import argparse
import json
import time

from ragpic import Config, RagPic

from compile_head_engine import engine_setup

HEAD = "Read the document below, then answer the question after it.\n\n"


def chunks_of(tokenizer, text: str, tokens: int, chunk_tokens: int) -> list[str]:
    """The first ``tokens`` tokens of ``text`` as texts of ``chunk_tokens`` tokens each."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:tokens]
    return [tokenizer.decode(ids[i:i + chunk_tokens]) for i in range(0, len(ids), chunk_tokens)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("gguf")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--chunk-tokens", type=int, default=512)
    p.add_argument("--behind", default="2,4,8")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    lm, haystack, _ = engine_setup(args.gguf)
    texts = chunks_of(lm.tokenizer, haystack, args.tokens, args.chunk_tokens)
    prompt = HEAD + "".join(texts) + "\n\nQuestion: what is the document about?"
    rows = []

    def timed(name: str, config: Config, in_order: bool) -> None:
        engine = RagPic(config, lm=lm)
        t0 = time.perf_counter()
        stored = engine.compile(texts, in_order=in_order, separator="") if in_order else engine.compile(texts)
        rows.append({"run": name, "entries": stored, "seconds": time.perf_counter() - t0})
        print(json.dumps(rows[-1]), flush=True)

    full = RagPic(Config(store=None, kv_quant="none", max_new_tokens=1), lm=lm)
    full.generate(prompt, method="full", max_new_tokens=1)  # warm-up: kernels, weights in cache
    g = full.generate(prompt, method="full", max_new_tokens=1)
    rows.append({"run": "full prefill of the prompt", "tokens": g.prompt_tokens, "seconds": g.ttft_s})
    print(json.dumps(rows[-1]), flush=True)
    timed("each chunk alone", Config(store=None, kv_quant="none"), False)
    for m in (int(x) for x in args.behind.split(",")):
        timed(f"alone + behind the head and {m}", Config(store=None, kv_quant="none", compile_behind=m,
                                                        compile_head=HEAD), True)
    base = rows[0]["seconds"]
    for r in rows:
        r["of_full_prefill"] = r["seconds"] / base
    print(f"{'run':<36} {'entries':>8} {'seconds':>9} {'x full prefill':>15}")
    for r in rows:
        print(f"{r['run']:<36} {r.get('entries', ''):>8} {r['seconds']:>9.1f} {r['of_full_prefill']:>14.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tokens": args.tokens, "chunk_tokens": args.chunk_tokens, "chunks": len(texts), "rows": rows},
                      f, indent=1)


if __name__ == "__main__":
    main()
