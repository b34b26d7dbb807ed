"""TTFT through the frameworks: a LlamaIndex query engine and a LangChain LCEL chain.

    python benchmarks/bench_frameworks.py --threads 2 --repeats 3 --json docs/results/bench_frameworks.json
        [--model M]   # any model ragpic loads (default: the embedded SmolLM2-135M)

Corpus: every full-length passage of the first ``--questions`` MuSiQue items (the shared
dev set when it sits beside the repository, else the bundled sample), embedded with
all-MiniLM-L6-v2 into FAISS, KV compiled at ingest. Each question goes through ``full``,
``legolink-16`` and ``legolink-16`` on an engine with the prefix cache off
(``Config(prefix_cache_tokens=0)``: the framework's system prompt and instruction recomputed
every time), interleaved (order rotated every repeat), with the same top-``k`` passages.
TTFT is wall time from the call to the first streamed piece of the answer (retrieval,
prompt formatting and the link included); ``engine`` is ragpic's own link + first token.
Medians over questions x repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("full", "legolink-16", "legolink-16/no-prefix")
"""What each question is asked with: a method name, ``/no-prefix`` on the engine without the prefix cache."""


def musique(n: int) -> list[dict]:
    shared = ROOT.parent / "shared" / "data" / "musique_dev.json"
    path = shared if shared.exists() else ROOT / "ragpic" / "data" / "musique_sample.json"
    return json.loads(path.read_text())[:n]


def first_piece_s(pieces) -> float:
    """Seconds until an iterator of streamed pieces yields a non-empty one (then drained)."""
    t0, first = time.perf_counter(), None
    for piece in pieces:
        if first is None and piece:
            first = time.perf_counter() - t0
    return first if first is not None else time.perf_counter() - t0


def llamaindex_ttft(engines, items, embed, folder: Path, k: int, new_tokens: int):
    """``run(variant, question) -> (ttft_s, engine_ttft_s, prompt_tokens, recomputed_tokens)``.

    ``engines``: ``{True: engine with the prefix cache, False: without}`` over one model and store."""
    from llama_index.core import Document

    from ragpic.llm.llamaindex import RagPicLLM
    from ragpic.llm.llamaindex import make_query_engine
    from ragpic.retriever_hooks.llamaindex import build_faiss_index

    docs = [Document(text=c["text"]) for it in items for c in it["ctxs"]]
    index = build_faiss_index(docs, engines[True], embed_model=embed, transformations=[], folder=folder)

    def run(variant: str, question: str):
        method, _, off = variant.partition("/")
        llm = RagPicLLM(engines[not off], max_new_tokens=new_tokens, method=method)
        qe = make_query_engine(index, llm, similarity_top_k=k, streaming=True)
        ttft = first_piece_s(qe.query(question).response_gen)
        g = llm.last_generation
        return ttft, g.ttft_s, g.prompt_tokens, g.recomputed_tokens

    return run


def langchain_ttft(engines, items, embed, k: int, new_tokens: int):
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import PromptTemplate
    from langchain_core.runnables import RunnablePassthrough

    from ragpic.llm.langchain import RagPicLLM
    from ragpic.retriever_hooks.langchain import faiss_from_documents

    class SameMiniLM(Embeddings):  # the LlamaIndex embedder, so both frameworks retrieve alike
        def embed_documents(self, texts):
            return embed.get_text_embedding_batch(list(texts))

        def embed_query(self, text):
            return embed.get_query_embedding(text)

    docs = [Document(page_content=c["text"]) for it in items for c in it["ctxs"]]
    retriever = faiss_from_documents(docs, SameMiniLM(), engines[True]).as_retriever(search_kwargs={"k": k})
    prompt = PromptTemplate.from_template(
        "Answer the question using the context.\n\nContext:\n{context}\n\nQuestion: {question}\nAnswer:")

    class Stats(BaseCallbackHandler):  # ragpic's figures ride in generation_info
        info: dict = {}

        def on_llm_end(self, response, **kwargs):
            self.info = dict(response.generations[0][0].generation_info or {})

    def run(variant: str, question: str):
        method, _, off = variant.partition("/")
        llm, stats = RagPicLLM(engine=engines[not off], method=method, max_new_tokens=new_tokens), Stats()
        ctx = retriever | (lambda ds: "\n\n".join(d.page_content for d in ds))
        chain = {"context": ctx, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()
        ttft = first_piece_s(chain.with_config(callbacks=[llm.hints, stats]).stream(question))
        return (ttft, stats.info.get("ttft_s", float("nan")), stats.info.get("prompt_tokens", 0),
                stats.info.get("recomputed_tokens", 0))

    return run


def measure(run, questions: list[str], repeats: int) -> dict:
    for m in METHODS:  # warm up every code path (and the prefix cache), untimed
        run(m, questions[0])
    keys = ("ttft_s", "engine_ttft_s", "prompt_tokens", "recomputed_tokens")
    out = {m: {key: [] for key in keys} for m in METHODS}
    for rep in range(repeats):
        for q in questions:
            for m in METHODS[rep % len(METHODS):] + METHODS[:rep % len(METHODS)]:
                for key, value in zip(keys, run(m, q)):
                    out[m][key].append(value)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--questions", type=int, default=3)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=4)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--model", default=None, help="HF folder, hub id or .gguf (default: embedded SmolLM2-135M)")
    p.add_argument("--dtype", default=None, help="as Config.dtype (default: fp32 on the CPU)")
    p.add_argument("--hold-dense", action="store_true", help="Config(hold_dense=True)")
    args = p.parse_args(argv)
    import torch

    from ragpic import Config, RagPic
    from ragpic.demo import embedding_model

    if args.threads:
        torch.set_num_threads(args.threads)
    items = musique(args.questions)
    questions = [it["question"] for it in items]
    embed = embedding_model()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        engine = RagPic(Config(store=str(Path(tmp) / "kv"), device="cpu", model=args.model, dtype=args.dtype,
                               hold_dense=args.hold_dense))
        engines = {True: engine, False: RagPic(Config(store=None, prefix_cache_tokens=0), lm=engine.lm,
                                                  store=engine.store)}
        runners = {"llamaindex": llamaindex_ttft(engines, items, embed, Path(tmp) / "li", args.top_k, args.new_tokens),
                   "langchain": langchain_ttft(engines, items, embed, args.top_k, args.new_tokens)}
        for name, run in runners.items():
            raw = measure(run, questions, args.repeats)
            med = {m: {key: statistics.median(v) for key, v in raw[m].items()} for m in METHODS}
            results[name] = {"median": med, "raw": raw,
                             "speedup": med["full"]["ttft_s"] / med["legolink-16"]["ttft_s"],
                             "prefix_cache_gain": med["legolink-16/no-prefix"]["ttft_s"] / med["legolink-16"]["ttft_s"]}
            print(f"{name:10s} " + "  ".join(
                f"{m}: {med[m]['ttft_s']:.2f} s (engine {med[m]['engine_ttft_s']:.2f} s, "
                f"{med[m]['recomputed_tokens']:.0f}/{med[m]['prompt_tokens']:.0f} tokens)" for m in METHODS)
                + f"  speed-up {results[name]['speedup']:.1f}x (prefix cache: "
                  f"{results[name]['prefix_cache_gain']:.2f}x)", file=sys.stderr)
    config = {"questions": args.questions, "top_k": args.top_k, "repeats": args.repeats, "dtype": args.dtype,
              "hold_dense": args.hold_dense,
              "new_tokens": args.new_tokens, "model": args.model or "SmolLM2-135M-Instruct (embedded)", "torch_threads": torch.get_num_threads()}
    if args.json:
        Path(args.json).write_text(json.dumps({"config": config, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
