"""How fast can the CPU run `legolink-16`'s link attention? (docs/RESULTS.md §8)

The link's attention is R short query bands (each chunk's first k tokens, then the query)
over an N-key cache. This times, on random tensors of SmolLM2-135M's attention shape
(9 query heads, 3 KV heads, head_dim 64) and the exact row positions of the bench prompt
(8 or 16 chunks of 512 tokens + a 32-token query), every way of computing it we tried:

- ``banded``: ragpic's banded SDPA (``ragpic.core.ops.attention.banded_sdpa``), one call per band;
- ``one-masked``: one masked R x N SDPA (transformers' path, GQA via ``enable_gqa``);
- ``key-blocks``: ragpic's CPU default (``ragpic.core.ops.key_blocks``, ARCHITECTURE.md §4.3): one
  pass over each band's stretch of keys for every later row (calls of up to R rows), each
  band's own rows causally, the parts merged by their log-sum-exp;
- ``flex`` (``--flex``): ``torch.compile``'d ``flex_attention`` with a block mask that skips
  every masked block (~30 s to compile).

and, as the yardsticks `full`'s prefill runs at: one causal N x N SDPA and the MLP's
576 x 1536 GEMM at M = N rows and at M = R rows. Every variant is checked against
``banded`` (max abs difference) before it is timed. Rates count useful FLOPs only
(4 x head_dim x heads per visible (row, key) pair), so a variant that computes masked
pairs is not credited for them.

With ``--link 4128,8192`` it also times the whole `legolink-16` link on the embedded SmolLM2
(the bench prompt) with the key-block pass on and off (``LoadedModel.key_blocks``),
interleaved, and reports the largest logit difference between the two.

    python benchmarks/attention_kernels.py --repeats 21 --flex --link 4128,8192 --json docs/results/attention_kernels.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from ragpic.core.ops.attention import banded_sdpa, plan_bands, query_bands
from ragpic.core.forward import additive_mask
from ragpic.core.ops.key_blocks import key_block_sdpa, plan_key_blocks

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def link_rows(chunks: int, chunk: int, k: int, query: int) -> list[int]:
    """Positions legolink-k recomputes: the first k of every chunk but the first, then the query."""
    return [c * chunk + i for c in range(1, chunks) for i in range(k)] + list(range(chunks * chunk, chunks * chunk + query))


def median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def variants(chunks: int, chunk: int, kr: int, query: int, flex: bool) -> tuple[dict, float, dict]:
    """(name -> callable, useful attention FLOPs, yardstick name -> (callable, FLOPs))."""
    pos = link_rows(chunks, chunk, kr, query)
    r, n = len(pos), chunks * chunk + query
    scale = HEAD_DIM ** -0.5
    q = torch.randn(1, HEADS, r, HEAD_DIM)
    k, v = torch.randn(1, KV_HEADS, n, HEAD_DIM), torch.randn(1, KV_HEADS, n, HEAD_DIM)
    mask = additive_mask(torch.tensor(pos), n, dtype=torch.float32)
    bands = query_bands(pos)
    plan = plan_bands(bands, mask, groups=HEADS // KV_HEADS, fold=None)
    blocks = plan_key_blocks(bands, pos, mask, groups=HEADS // KV_HEADS)
    out = {
        "banded": lambda: banded_sdpa(None, q, k, v, mask, scaling=scale, ragpic_bands=plan)[0],
        "one-masked": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                                             enable_gqa=True).transpose(1, 2),
        "key-blocks": lambda: key_block_sdpa(q, k, v, blocks, scale),
    }
    if flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        qpos = torch.tensor(pos)
        block_mask = create_block_mask(lambda b, h, qi, ki: ki <= qpos[qi], 1, 1, r, n, device="cpu",
                                       BLOCK_SIZE=(kr, 128))
        compiled = torch.compile(flex_attention, dynamic=False)  # a dynamic recompile fails in inductor 2.13
        out["flex"] = lambda: compiled(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True).transpose(1, 2)
    flops = sum(4 * HEAD_DIM * HEADS * (p + 1) for p in pos)
    fq, fk, fv = torch.randn(1, HEADS, n, HEAD_DIM), torch.randn(1, KV_HEADS, n, HEAD_DIM), torch.randn(1, KV_HEADS, n, HEAD_DIM)
    w = torch.randn(1536, 576)
    xs = {m: torch.randn(m, 576) for m in (r, n)}
    yard = {
        f"full causal SDPA, {n} rows": (lambda: F.scaled_dot_product_attention(fq, fk, fv, is_causal=True, enable_gqa=True),
                                        4 * HEAD_DIM * HEADS * n * (n + 1) / 2),
        f"MLP GEMM 576x1536, M={n} (full)": (lambda: F.linear(xs[n], w), 2 * n * 576 * 1536),
        f"MLP GEMM 576x1536, M={r} (link)": (lambda: F.linear(xs[r], w), 2 * r * 576 * 1536),
    }
    return out, flops, yard


def run(chunk_counts: list[int], repeats: int, flex: bool, threads: int) -> dict:
    torch.set_num_threads(threads)
    rows = []
    for chunks in chunk_counts:
        fns, flops, yard = variants(chunks, 512, 16, 32, flex)
        ref = fns["banded"]()
        diffs = {name: float((fn() - ref).abs().max()) for name, fn in fns.items()}
        times: dict[str, list[float]] = {name: [] for name in fns}
        for rep in range(3):  # interleaved rounds: drift hits every variant alike
            for name, fn in fns.items():
                times[name].append(median_ms(fn, max(1, repeats // 3)))
                print(f"  {chunks * 512 + 32} tokens, round {rep + 1}/3: {name} {times[name][-1]:.2f} ms", flush=True)
        for name in fns:
            ms = statistics.median(times[name])
            rows.append({"context_tokens": chunks * 512 + 32, "variant": name, "ms_per_layer": ms,
                         "gflops": flops / ms / 1e6, "max_abs_diff_vs_banded": diffs[name]})
        for name, (fn, fl) in yard.items():
            ms = median_ms(fn, max(3, repeats // 2))
            rows.append({"context_tokens": chunks * 512 + 32, "variant": name, "ms_per_layer": ms,
                         "gflops": fl / ms / 1e6, "max_abs_diff_vs_banded": None})
    return {"config": {"threads": threads, "repeats": repeats, "heads": HEADS, "kv_heads": KV_HEADS,
                       "head_dim": HEAD_DIM, "torch": torch.__version__,
                       "cpu_capability": torch.backends.cpu.get_cpu_capability()}, "rows": rows}


def link_ab(lengths: list[int], repeats: int, method: str = "legolink-16") -> list[dict]:
    """Link seconds of ``method`` on SmolLM2 with the key-block pass on and off, same segments."""
    import dataclasses

    from ragpic.core.link import link
    from ragpic.core.model import load_model
    from ragpic.core.ops.linked_cache import SlabPool
    from ragpic.core.segments import Segment, chunk_segment
    from ragpic.eval.bench import bench_prompt, query_ids
    from ragpic.eval.data import default_haystack, load_haystack
    from ragpic.eval.variants import compile_for

    lm = load_model()
    models = {"key-blocks": lm, "one call per band": dataclasses.replace(lm, key_blocks=False)}
    tokens = lm.tokenizer(load_haystack(default_haystack()), add_special_tokens=False)["input_ids"]
    rows, pool = [], SlabPool()
    for n in lengths:
        chunks, q = bench_prompt(tokens, query_ids(lm.tokenizer, 32), n, 512)
        (kvs,) = compile_for(lm, chunks, [method], {}).values()
        segs = [chunk_segment(kv) for kv in kvs] + [Segment(torch.tensor(q))]
        first = {name: link(m, segs, method, pool=pool) for name, m in models.items()}
        diff = float((first["key-blocks"].logits - first["one call per band"].logits).abs().max())
        for res in first.values():
            pool.release(res.cache)
        times: dict[str, list[float]] = {name: [] for name in models}
        for rep in range(repeats):
            for name in (list(models) if rep % 2 else list(models)[::-1]):
                res = link(models[name], segs, method, pool=pool)
                times[name].append(res.seconds)
                pool.release(res.cache)
            print(f"  link {n} tokens, repeat {rep + 1}/{repeats}: " +
                  "  ".join(f"{k} {v[-1]:.3f}s" for k, v in times.items()), flush=True)
        rows += [{"context_tokens": n, "variant": f"{method} link, {name}", "link_s": statistics.median(v),
                  "link_s_all": v, "max_logit_diff": diff} for name, v in times.items()]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", default="8,16", help="chunk counts (8 -> 4128 tokens, 16 -> 8224)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flex", action="store_true", help="also time torch.compile'd flex_attention (~30 s compile)")
    ap.add_argument("--link", help="also time the legolink-16 link on SmolLM2 at these lengths, e.g. 4128,8192")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args()
    result = run([int(c) for c in args.chunks.split(",")], args.repeats, args.flex, args.threads)
    if args.link:
        result["link"] = link_ab([int(n) for n in args.link.split(",")], max(3, args.repeats // 3))
    print(f"{'tokens':>7} {'variant':<36} {'ms/layer':>9} {'GFLOP/s':>8} {'max diff':>9}")
    for row in result["rows"]:
        d = row["max_abs_diff_vs_banded"]
        print(f"{row['context_tokens']:>7} {row['variant']:<36} {row['ms_per_layer']:>9.2f} {row['gflops']:>8.1f} "
              f"{'' if d is None else f'{d:.1e}':>9}")
    for row in result.get("link", []):
        print(f"{row['context_tokens']:>7} {row['variant']:<36} {row['link_s']:>8.3f} s  max logit diff {row['max_logit_diff']:.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
