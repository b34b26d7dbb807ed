"""Chunks compiled behind context (the document's previous chunk, or FusionRAG's vector-index
neighbours), measured on the RULER-style tasks and MuSiQue (docs/RESULTS.md §16). A candidate,
not a method.

Every chunk is compiled once more, at ingest, behind a prefix, and the prefix's rows are
dropped: its KV then carries what it saw of the prefix, and the link re-rotates it from base
position ``len(prefix)`` to its place as for any chunk. Recipes (``--variants recipe:method``):

- ``plain``: the chunk alone at position 0 (ragpic's compile; the baseline).
- ``nbr<m>``: behind its ``m`` nearest neighbours by all-MiniLM-L6-v2 (the demo's offline
  embedder): each chunk is embedded as 100-word windows (MiniLM reads 256 word pieces, a
  512-token chunk is longer) and two chunks are as close as their closest pair of windows. The
  nearest neighbour sits next to the chunk. ``--pool prompt`` (default) searches the prompt's
  own chunks, FusionRAG's best case (every neighbour found at ingest is retrieved with the
  chunk); ``--pool run`` searches every chunk of every prompt in the run, where the filler
  essays repeat across prompts and most neighbours come from other prompts.
- ``lex<m>``: the same with BM25 over words instead of MiniLM (hybrid retrieval's lexical half).
- ``prev``: behind the chunk before it in its document (the prompt's previous chunk; the first
  is ``plain``): what an ingest that keeps a document's order can do with no index at all.
  ``prev<m>``: behind the ``m`` chunks before it.
- ``other``: the control for ``prev``: behind the chunk at the same place in the **next prompt**
  of the run (a prefix of the same length and genre that is not the chunk's context; the
  first chunk is ``plain``), to tell what the real predecessor brings from what any text
  before the chunk brings.

Each prompt runs ``full`` once; every variant is scored as ``ragpic eval ruler`` scores (``--tasks
musique``: the shipped MuSiQue questions as ``ragpic eval`` builds them, gold F1 and TF KL per
variant, paired against ``plain:naive``'s when it runs), with TF KL over ``full``'s answer.
``--check`` first verifies the machinery: chunks compiled behind their true context must link
to ``full`` with ``naive``. Neighbour recall is reported per recipe: the share of a chunk's
prefix drawn from its own prompt, and for variable tracking the share of chain links whose
previous link's chunk is in the prefix (what the recipe needs to repair that task).

    python benchmarks/neighbour_compile.py --model $M --length 4096 --samples 4 \\
        --tasks vt,niah_multivalue,niah_multiquery,cwe \\
        --variants plain:legolink-16,prev:legolink-16,nbr2:legolink-16,nbr2:qp-5 \\
        --threads 2 --json docs/results/neighbour_compile_qwen05b.json
    python benchmarks/neighbour_compile.py --model $M --tasks musique --samples 32 \\
        --variants plain:naive,plain:legolink-16,nbr1:legolink-16,nbr2:legolink-16,nbr2:qp-5 \\
        --threads 2 --json docs/results/neighbour_compile_musique_qwen05b.json
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache

from ragpic.core.runner import runner_for
from ragpic.core.kv import ChunkKV
from ragpic.core.link import link
from ragpic.core.model import LoadedModel, load_model
from ragpic.eval import scoring
from ragpic.eval.data import (GLUE, QA_INSTRUCTION, default_dataset, default_haystack, load_haystack, load_qa,
                              qa_chunk_ids, template_parts)
from ragpic.eval.evaluate import against_full, run_method
from ragpic.eval.ruler import score_answer
from ragpic.eval.ruler_tasks import TASKS, generate_sample
from ragpic.eval.variants import prompt_segments

WINDOW_WORDS, WINDOW_STRIDE = 100, 50


def windows(text: str) -> list[str]:
    """``text`` as overlapping windows of WINDOW_WORDS words (at least one)."""
    words = text.split()
    starts = range(0, max(1, len(words) - WINDOW_WORDS + WINDOW_STRIDE), WINDOW_STRIDE)
    return [" ".join(words[s:s + WINDOW_WORDS]) for s in starts]


def _top(close: torch.Tensor, texts: list[str], m: int) -> list[list[int]]:
    """Each row's ``m`` best columns, nearest first, never itself or an identical copy."""
    n = len(texts)
    for i in range(n):
        for j in range(n):
            if texts[i] == texts[j]:
                close[i, j] = float("-inf")  # itself, or an identical copy: no new context
    return [close[i].topk(m).indices.tolist() for i in range(n)]


def bm25_closeness(texts: list[str]) -> torch.Tensor:
    """``(n, n)``: row ``i`` scores every text by BM25 (k1 = 1.2, b = 0.75) with text ``i``'s
    distinct words as the query; idf over ``texts``, so it depends on the pool searched."""
    docs = [re.findall(r"[a-z0-9]+", t.lower()) for t in texts]
    n, avg = len(docs), sum(map(len, docs)) / len(docs)
    df = Counter(w for d in docs for w in set(d))
    idf = {w: math.log((n - k + 0.5) / (k + 0.5) + 1) for w, k in df.items()}
    tfs = [Counter(d) for d in docs]
    close = torch.zeros((n, n))
    for i in range(n):
        for j in range(n):
            norm = 1.2 * (0.25 + 0.75 * len(docs[j]) / avg)
            close[i, j] = sum(idf[w] * tfs[j][w] * 2.2 / (tfs[j][w] + norm) for w in tfs[i] if w in tfs[j])
    return close


def minilm_closeness(texts: list[str]) -> torch.Tensor:
    """``(n, n)`` cosine by MiniLM between the closest pair of windows of two texts; pairwise,
    so one matrix over every text serves any pool."""
    from ragpic.demo.app import embedding_model

    owner, flat = [], []
    for i, t in enumerate(texts):
        for w in windows(t):
            owner.append(i)
            flat.append(w)
    vecs = torch.nn.functional.normalize(torch.tensor(embedding_model().get_text_embedding_batch(flat)), dim=-1)
    owner_t = torch.tensor(owner)
    sim = vecs @ vecs.T  # (W, W) cosine between windows
    n = len(texts)
    close = torch.empty((n, n))
    for i in range(n):
        close[i] = torch.stack([sim[owner_t == i][:, owner_t == j].max() for j in range(n)])
    return close


@torch.inference_mode()
def compile_behind(lm: LoadedModel, prefix: list[int], ids: list[int]) -> ChunkKV:
    """``ids`` prefilled after ``prefix`` (positions from 0), the prefix's rows dropped:
    keys and values ``(L, H_kv, T, D)`` rotated from ``base_position = len(prefix)``."""
    seq = torch.tensor(prefix + ids, device=lm.device)[None]
    cache = DynamicCache()
    runner_for(lm).prefill(seq, torch.arange(seq.shape[1], device=lm.device)[None], cache)
    p = len(prefix)
    keys = torch.stack([layer.keys[0, :, p:] for layer in cache.layers])
    values = torch.stack([layer.values[0, :, p:] for layer in cache.layers])
    return ChunkKV(token_ids=torch.tensor(ids), keys=keys, values=values, base_position=p,
                   fingerprint=lm.fingerprint, recipe="plain")


def neighbours(recipes: list[str], texts: list[str], groups: list[list[int]]) -> dict[str, list[list[int]]]:
    """Per ``nbr<m>`` / ``lex<m>`` recipe, every chunk's neighbours (global indices, nearest
    first), searched within each group of global indices. MiniLM embeds every text once; BM25
    scores each group on its own (its idf is the group's)."""
    kinds = {r[:3] for r in recipes if r[:3] in ("nbr", "lex")}
    minilm = minilm_closeness(texts) if "nbr" in kinds else None
    closeness = {}  # (kind, group) -> (len(g), len(g))
    for k, g in enumerate(groups):
        if minilm is not None:
            closeness["nbr", k] = minilm[g][:, g]
        if "lex" in kinds:
            closeness["lex", k] = bm25_closeness([texts[i] for i in g])
    out = {}
    for r in recipes:
        if r[:3] not in kinds:
            continue
        table: list[list[int]] = [[] for _ in texts]
        for k, g in enumerate(groups):
            local = _top(closeness[r[:3], k].clone(), [texts[i] for i in g], int(r[3:]))
            for i, near in zip(g, local):
                table[i] = [g[j] for j in near]
        out[r] = table
    return out


def prefixes(recipe: str, prompt: int, n_chunks: int, nbrs: dict[str, list[list[int]]],
             slot: dict[tuple[int, int], int]) -> list[list[int]]:
    """Global chunk indices behind each of a prompt's chunks, in prefix order (nearest last)."""
    if recipe == "plain":
        return [[] for _ in range(n_chunks)]
    if recipe.startswith("prev"):
        m = int(recipe[4:] or 1)
        return [[slot[prompt, j] for j in range(max(0, c - m), c)] for c in range(n_chunks)]
    if recipe == "other":
        other = (prompt + 1) % (1 + max(k[0] for k in slot))
        return [[slot[other, c - 1]] if c and (other, c - 1) in slot else [] for c in range(n_chunks)]
    return [list(reversed(nbrs[recipe][slot[prompt, c]])) for c in range(n_chunks)]


@torch.inference_mode()
def check_exact(lm: LoadedModel, pr: "Prompt") -> float:
    """Max |logit difference| between ``full`` and ``naive`` over chunks compiled behind their
    **true** context (the prompt's prefix and every chunk before): :func:`compile_behind` and the
    link's re-rotation then leave nothing to approximate, so it must be rounding only."""
    pre = lm.tokenizer(pr.prefix, add_special_tokens=False)["input_ids"]
    glue = lm.tokenizer(pr.glue, add_special_tokens=False)["input_ids"] if pr.glue else []
    kvs, seen = [], list(pre)
    for c, ids in enumerate(pr.ids):
        kvs.append(compile_behind(lm, seen, ids))
        seen += ids + glue
    behind = prompt_segments(lm.tokenizer, pr.prefix, kvs, pr.suffix, glue=pr.glue)
    alone = prompt_segments(lm.tokenizer, pr.prefix, [compile_behind(lm, [], ids) for ids in pr.ids], pr.suffix,
                           glue=pr.glue)
    return float((link(lm, behind, "naive").logits - link(lm, alone, "full").logits).abs().max())


@dataclass(slots=True)
class Prompt:
    """One evaluation prompt: ``prefix`` text, chunks (ids and text), ``suffix`` text, the glue
    text between chunks, and how an answer scores. ``chain``: for variable tracking, the chunk
    holding each link of the chain, in chain order (else empty)."""

    task: str
    index: int
    prefix: str
    ids: list[list[int]]
    texts: list[str]
    suffix: str
    glue: str | None
    max_new: int
    score: Callable[[str], float]
    chain: list[int] = field(default_factory=list)


def ruler_prompts(tok, tasks: list[str], length: int, samples: int, seed: int) -> list[Prompt]:
    haystack = load_haystack(default_haystack())
    out = []
    for t in tasks:
        for i in range(samples):
            s = generate_sample(tok, haystack, t, length, i, seed=seed)
            chain = ([next(c for c, ch in enumerate(s.chunks) if link in ch.text) for link in s.needles]
                     if t == "vt" else [])
            out.append(Prompt(t, i, s.prefix, [list(c.ids) for c in s.chunks], [c.text for c in s.chunks], s.suffix,
                              None, TASKS[t].max_new_tokens, functools.partial(score_answer, s), chain))
    return out


def musique_prompts(tok, limit: int, passage_tokens: int) -> list[Prompt]:
    """The shipped MuSiQue questions as ``ragpic eval`` builds them; scored by gold F1."""
    before, after = template_parts(tok)
    out = []
    for i, ex in enumerate(load_qa(default_dataset(), limit=limit)):
        ids = qa_chunk_ids(tok, ex, passage_tokens=passage_tokens)
        out.append(Prompt("musique", i, before + QA_INSTRUCTION, ids, [tok.decode(c) for c in ids],
                          f"{GLUE}Question: {ex.question}{after}", GLUE, 32,
                          functools.partial(scoring.max_over, scoring.f1_score, golds=ex.answers)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="a model name or path (default: the embedded SmolLM2)")
    p.add_argument("--dtype", default=None)
    p.add_argument("--hold-dense", action="store_true",
                   help="a GGUF's layers keep their dense weights once made (ragpic eval's --hold-dense)")
    p.add_argument("--variants", default="plain:legolink-16,prev:legolink-16,nbr1:legolink-16,nbr2:legolink-16")
    p.add_argument("--tasks", default="vt,niah_multivalue", help="RULER tasks, or 'musique'")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--samples", type=int, default=4, help="per RULER task; MuSiQue: questions")
    p.add_argument("--passage-tokens", type=int, default=192, help="MuSiQue: each passage cut to N tokens")
    p.add_argument("--pool", choices=("prompt", "run"), default="prompt",
                   help="where nbr/lex neighbours are searched: the prompt's chunks, or every prompt's")
    p.add_argument("--check", action="store_true",
                   help="first verify on prompt 0 that chunks compiled behind their true context link to full")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    variants = a.variants.split(",")
    for v in variants:
        if not re.fullmatch(r"(plain|other|prev\d*|(nbr|lex)\d+):.+", v):
            p.error(f"--variants: {v!r} is not <plain|prev[<m>]|other|nbr<m>|lex<m>>:<method>")
    if a.threads:
        torch.set_num_threads(a.threads)
    lm = load_model(a.model, dtype=a.dtype, hold_dense=a.hold_dense)
    tasks = a.tasks.split(",")
    prompts = (musique_prompts(lm.tokenizer, a.samples, a.passage_tokens) if tasks == ["musique"]
               else ruler_prompts(lm.tokenizer, tasks, a.length, a.samples, a.seed))
    slot, texts, ids = {}, [], []
    for s_i, pr in enumerate(prompts):
        for c, (chunk_ids, text) in enumerate(zip(pr.ids, pr.texts)):
            slot[s_i, c] = len(texts)
            texts.append(text)
            ids.append(chunk_ids)
    t0 = time.perf_counter()
    groups = ([[slot[s_i, c] for c in range(len(pr.ids))] for s_i, pr in enumerate(prompts)] if a.pool == "prompt"
              else [list(range(len(texts)))])
    recipes = list(dict.fromkeys(["plain"] + [v.split(":")[0] for v in variants]))  # full links plain chunks
    nbrs = neighbours(recipes, texts, groups)
    print(f"[{time.perf_counter() - t0:.0f}s] neighbours of {len(texts)} chunks", file=sys.stderr)

    if a.check:
        err = check_exact(lm, prompts[0])
        print(f"[{time.perf_counter() - t0:.0f}s] check: chunks behind their true context, naive vs full: "
              f"max |logit diff| {err:.2e}", file=sys.stderr)
        if err > 1e-3:
            raise SystemExit(f"--check failed: {err:.2e} > 1e-3; compile_behind or the re-rotation is wrong")

    records = []
    for s_i, pr in enumerate(prompts):
        n = len(pr.ids)
        segs, compile_s, recall = {}, {}, {}
        own = {slot[s_i, c] for c in range(n)}
        for r in recipes:
            pre = prefixes(r, s_i, n, nbrs, slot)
            t = time.perf_counter()
            kvs = [compile_behind(lm, [tok for g in pre[c] for tok in ids[g]], pr.ids[c]) for c in range(n)]
            compile_s[r] = time.perf_counter() - t
            segs[r] = prompt_segments(lm.tokenizer, pr.prefix, kvs, pr.suffix, glue=pr.glue)
            drawn = [g for c in range(n) for g in pre[c]]
            recall[r] = {"own_prompt": (sum(g in own for g in drawn) / len(drawn)) if drawn else None,
                         "chain_links_seen": (sum(slot[s_i, prev] in pre[c] for prev, c in zip(pr.chain, pr.chain[1:]))
                                              / (len(pr.chain) - 1)) if pr.chain else None}
        full = run_method(lm, segs["plain"], "full", pr.max_new, "self")
        rec = {"task": pr.task, "sample": pr.index, "recall": recall, "compile_s": compile_s,
               "full": {"answer": full.answer, "score": pr.score(full.answer)}}
        for v in variants:
            recipe, method = v.split(":")
            run = run_method(lm, segs[recipe], method, pr.max_new, full.answer_ids)
            rec[v] = {**against_full(run, full), "score": pr.score(run.answer), "speedup": full.seconds / run.seconds}
        records.append(rec)
        if a.json:  # after every prompt: a long run stopped early keeps what it measured
            with open(a.json, "w") as f:
                json.dump({"config": vars(a), "samples": records}, f, indent=1)
        print(f"[{time.perf_counter() - t0:.0f}s] {pr.task} {pr.index}: full {rec['full']['score']:.2f} "
              + " ".join(f"{v}={rec[v]['score']:.2f}/KL {rec[v]['tf_kl_vs_full']:.3f}" for v in variants)
              + " recall " + " ".join(f"{r}={x['chain_links_seen']}" for r, x in recall.items()), file=sys.stderr)

    summary = {task: summarise([r for r in records if task in ("all", r["task"])], variants)
               for task in dict.fromkeys([pr.task for pr in prompts] + ["all"])}
    for task, row in summary.items():
        print(f"{task:16s} full {row['full']:.2f}  " + "  ".join(
            f"{v}: {row[v]['score']:.2f} KL {row[v]['tf_kl']:.3f}" for v in variants))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "summary": summary, "samples": records}, f, indent=1)
    return 0


def summarise(rows: list[dict], variants: list[str]) -> dict:
    """Per variant: mean score and its paired ratio to ``full``'s, TF KL (and its paired ratio
    to ``plain:naive``'s when that variant ran), answers equal to ``full``'s, speed-up."""
    full = [r["full"]["score"] for r in rows]
    out: dict = {"full": scoring.mean(full)}
    for v in variants:
        sc, kl = [r[v]["score"] for r in rows], [r[v]["tf_kl_vs_full"] for r in rows]
        out[v] = {"score": scoring.mean(sc), "ratio_ci95": scoring.paired_ratio_ci(sc, full),
                  "tf_kl": scoring.mean(kl), "same_as_full": sum(r[v]["same_as_full"] for r in rows),
                  "speedup_median": statistics.median(r[v]["speedup"] for r in rows),
                  "compile_s_median": statistics.median(r["compile_s"][v.split(":")[0]] for r in rows)}
        if "plain:naive" in variants:
            out[v]["tf_kl_ratio_vs_naive_ci95"] = scoring.paired_ratio_ci(kl, [r["plain:naive"]["tf_kl_vs_full"]
                                                                              for r in rows])
    return out


if __name__ == "__main__":
    raise SystemExit(main())
