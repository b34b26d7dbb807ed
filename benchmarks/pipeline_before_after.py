"""Check a change of the request pipeline against an older checkout: same tokens, same speed.

    python benchmarks/pipeline_before_after.py outputs TREE OUT.json   # greedy + sampled + streamed outputs
    python benchmarks/pipeline_before_after.py compare A.json B.json   # token/text differences, count changes
    python benchmarks/pipeline_before_after.py speed TREE               # link and decode speed (one JSON line)

``TREE`` is the root of a checkout (``git worktree add /tmp/base <commit>``); its ``ragpic`` is
imported instead of the installed one. ``outputs`` runs every public link method and three experimental ones on the README's
prompt and three MuSiQue prompts (greedy, 32 tokens), one seeded sampled answer with stop
strings and one stream with a stop string per method, on the embedded SmolLM2. Run ``speed``
for both trees alternated (base, new, base, new) in one sitting on a quiet machine.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

METHODS = ("full", "naive", "legolink-16", "legolink-0", "auto", "fast", "balanced", "faithful", "experimental:qr-10",
           "experimental:qp-10", "experimental:cacheblend-15")
README = ["Dolores Park is a city park in the Mission District of San Francisco. On sunny days it "
          "fills with people who bring a sandwich and sit on the grass.",
          "The Golden Gate Bridge is a suspension bridge spanning the Golden Gate, the strait "
          "between San Francisco Bay and the Pacific Ocean."]


def _engine(tree: str, max_new_tokens: int):
    sys.path.insert(0, tree)
    import ragpic
    from ragpic import Config, RagPic

    assert ragpic.__file__.startswith(os.path.abspath(tree)), ragpic.__file__
    return RagPic(Config(max_new_tokens=max_new_tokens))


def outputs(tree: str, out: str) -> None:
    engine = _engine(tree, 32)
    data = os.path.join(os.path.dirname(__file__), "..", "ragpic", "data", "musique_sample.json")
    prompts = [("Answer using the passages.\n\n" + "\n\n".join(README) + "\n\nQuestion: What do people do in "
                "Dolores Park?", README)]
    for ex in json.load(open(data))[:3]:
        ps = [c["text"] for c in ex["ctxs"][:4]]
        prompts.append(("Answer the question from the passages.\n\n" + "\n\n".join(ps) + f"\n\nQuestion: "
                        f"{ex['question']}", ps))
    rows = []
    for m in METHODS:
        for i, (p, ps) in enumerate(prompts):
            engine.compile(ps, method=m)
            g = engine.generate(p, hints=ps, method=m)
            rows.append({"m": m, "i": i, "ids": g.token_ids, "text": g.text, "fr": g.finish_reason,
                         "prompt": g.prompt_tokens, "rec": g.recomputed_tokens, "cached": g.cached_tokens})
        g = engine.generate(prompts[1][0], hints=prompts[1][1], method=m, temperature=0.8, top_p=0.9, seed=3,
                            stop=["\n", " the"])
        rows.append({"m": m, "i": "sampled", "ids": g.token_ids, "text": g.text, "fr": g.finish_reason})
        s = engine.stream(prompts[0][0], method=m, stop=["Park"], max_new_tokens=20)
        deltas = list(s)
        rows.append({"m": m, "i": "stream", "deltas": deltas, "ids": s.result.token_ids, "fr": s.result.finish_reason})
    json.dump(rows, open(out, "w"))
    print(f"{len(rows)} records -> {out}")


def compare(a_path: str, b_path: str) -> int:
    a, b = json.load(open(a_path)), json.load(open(b_path))
    diffs = 0
    for x, y in zip(a, b, strict=True):
        for k in ("ids", "text", "fr", "deltas"):
            if x.get(k) != y.get(k):
                diffs += 1
                print("DIFF", x["m"], x["i"], k, x.get(k), "|", y.get(k))
        for k in ("prompt", "rec", "cached"):
            if k in x and x[k] != y[k]:
                print("count", x["m"], x["i"], k, x[k], "->", y[k])
    print(f"token/text differences: {diffs} of {len(a)} records")
    return 1 if diffs else 0


def speed(tree: str) -> None:
    import torch

    torch.set_num_threads(2)
    engine = _engine(tree, 64)
    hd = os.path.join(os.path.dirname(__file__), "..", "ragpic", "data", "haystack")
    words = " ".join(open(os.path.join(hd, f)).read() for f in sorted(os.listdir(hd))[:4]).split()
    chunks = [" ".join(words[i:i + 300]) for i in range(0, 1800, 300)]
    engine.compile(chunks)
    prompt = "\n\n".join(chunks) + "\n\nQuestion: summarise the essay in one paragraph."
    engine.lm.model.generation_config.eos_token_id = None  # a fixed answer length where the tokenizer allows
    out = {"tree": tree}
    for m in ("legolink-16", "full"):
        engine.generate(prompt, method=m, max_new_tokens=4)  # warm
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            g = engine.generate(prompt, method=m)
            per_token = (time.perf_counter() - t0 - g.ttft_s) / max(1, len(g.token_ids) - 1)
            runs.append((g.link_s, g.ttft_s, per_token))
        out[m] = {"link_s": statistics.median(r[0] for r in runs), "ttft_s": statistics.median(r[1] for r in runs),
                  "decode_tok_s": 1 / statistics.median(r[2] for r in runs), "tokens": len(g.token_ids),
                  "prompt": g.prompt_tokens}
    print(json.dumps(out))


if __name__ == "__main__":
    cmd, *args = sys.argv[1:] or ["help"]
    if cmd == "outputs" and len(args) == 2:
        outputs(*args)
    elif cmd == "compare" and len(args) == 2:
        sys.exit(compare(*args))
    elif cmd == "speed" and len(args) == 1:
        speed(*args)
    else:
        sys.exit(__doc__)
