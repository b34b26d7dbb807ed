"""``ragpic compile`` in process: chunk texts as the frameworks cut them, idempotent runs,
resumption after a kill, and failures that are never reported as success (tiny random model)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corpus_helpers import folder_keys, write_corpus, write_jsonl
from tiny import saved_tiny_model

from ragpic.cli.main import main


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(saved_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "docs")


def compile_json(capsys, *args: str) -> tuple[int, dict]:
    code = main(["compile", *args, "--quiet", "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if code in (0, 1) else {}


def keys_of(model: str, texts: list[str]) -> set[str]:
    """The store keys of ``texts``, less those under ``min_chunk_tokens`` (never cached)."""
    from ragpic import Config
    from ragpic.cache import chunk_key
    from ragpic.core.model import load_model

    lm = load_model(model, device="cpu")
    n = lambda t: len(lm.tokenizer(t, add_special_tokens=False)["input_ids"])
    return {chunk_key(lm.fingerprint, t, "plain", lm.dtype) for t in texts if n(t) >= Config().min_chunk_tokens}


def test_keys_are_the_chunks_llamaindex_puts_in_prompts(model, corpus, tmp_path, capsys):
    """The store holds exactly the node texts a LlamaIndex pipeline over the same files makes
    (SentenceSplitter in model tokens, the file metadata line): what the demo's index links."""
    from llama_index.core import Document
    from llama_index.core.node_parser import SentenceSplitter
    from transformers import AutoTokenizer

    from ragpic.retriever_hooks.llamaindex import node_text

    code, report = compile_json(capsys, str(corpus), "--store", str(tmp_path / "kv"), "--model", model,
                                "--chunk-tokens", "64")
    assert code == 0 and report["ok"]
    tok = AutoTokenizer.from_pretrained(model)
    splitter = SentenceSplitter(chunk_size=64, chunk_overlap=0,
                                tokenizer=lambda t: tok(t, add_special_tokens=False)["input_ids"])
    names = ["doc0.txt", "doc1.md", "sub/doc2.txt"]  # the hidden folder's file is skipped
    nodes = splitter.get_nodes_from_documents(
        [Document(text=(corpus / n).read_text(), id_=n, metadata={"file": n}) for n in names])
    texts = [node_text(n) for n in nodes]
    assert report["documents"] == 3 and report["chunks"] == len(texts) > 20
    assert all(t.startswith("file: ") for t in texts)
    assert folder_keys(tmp_path / "kv") == keys_of(model, texts)


def test_a_second_run_compiles_nothing(model, corpus, tmp_path, capsys):
    store = ["--store", str(tmp_path / "kv"), "--model", model, "--chunk-tokens", "64"]
    code, first = compile_json(capsys, str(corpus), *store)
    assert code == 0 and first["compiled"] == first["distinct"] > 0 and first["tokens"] > 0
    assert first["write_s"] > 0 and first["compile_s"] > 0
    code, second = compile_json(capsys, str(corpus), *store)
    assert code == 0 and second["compiled"] == 0 and second["tokens"] == 0
    assert second["stored_before"] == first["distinct"] and second["missing"] == 0
    assert main(["store", "check", str(tmp_path / "kv")]) == 0


def test_jsonl_with_the_langchain_chunker(model, tmp_path, capsys):
    from langchain_text_splitters import RecursiveCharacterTextSplitter
    from transformers import AutoTokenizer

    rows = write_jsonl(tmp_path / "rows.jsonl")
    code, report = compile_json(capsys, str(rows), "--store", str(tmp_path / "kv"), "--model", model,
                                "--chunker", "langchain", "--chunk-tokens", "32")
    assert code == 0 and report["documents"] == 4
    splitter = RecursiveCharacterTextSplitter.from_huggingface_tokenizer(
        AutoTokenizer.from_pretrained(model), chunk_size=32, chunk_overlap=0)
    texts = [c for line in rows.read_text().splitlines() if line.strip()
             for c in splitter.split_text(json.loads(line)["text"])]
    assert folder_keys(tmp_path / "kv") == keys_of(model, texts)


def test_the_python_api_takes_framework_documents(model, tmp_path):
    """LlamaIndex Documents keep their own settings: a key hidden from the LLM stays out of the text."""
    from llama_index.core import Document

    from ragpic.corpus import CompileJob, compile_corpus

    docs = [Document(text="the quick brown fox jumps over the lazy dog. " * 6, metadata={"title": "fox", "secret": "x"},
                     excluded_llm_metadata_keys=["secret"])]
    report = compile_corpus(CompileJob(store=str(tmp_path / "kv"), model=model, chunk_tokens=256), docs,
                            progress=False)
    assert report.ok and report.compiled == 1
    assert folder_keys(tmp_path / "kv") == keys_of(model, ["title: fox\n\n" + docs[0].text.strip()])


@pytest.mark.parametrize("args, expect", [
    (["/no/such/folder"], "SOURCE /no/such/folder: no such file or folder"),
    (["{corpus}", "--store", "memory"], "--store 'memory': a memory store ends with the run"),
    (["{corpus}", "--store", "s3://bucket/kv"], "--store: store='s3://bucket/kv': unknown scheme"),
    (["{corpus}", "--chunk-tokens", "8"], "argument --chunk-tokens: must be >= 16"),
    (["{corpus}", "--chunker", "words"], "argument --chunker: invalid choice: 'words'"),
    (["{bad}"], "bad.jsonl:2: not JSON"),
])
def test_bad_input_names_the_argument(model, corpus, tmp_path, capsys, args, expect):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a fine first line, long enough to be a chunk of its own"}\n{"text": oops}\n')
    args = [a.format(corpus=corpus, bad=bad) for a in args]
    store = [] if "--store" in args else ["--store", str(tmp_path / "kv")]
    assert main(["compile", *args, *store, "--model", model, "--quiet"]) == 2
    assert expect in capsys.readouterr().err
    assert not (tmp_path / "kv" / "entries").exists() or not folder_keys(tmp_path / "kv")


def test_a_killed_run_finishes_when_run_again(model, tmp_path):
    """SIGKILL mid-run keeps the batches written; the rerun compiles only the rest, and the
    store checks clean (no half-written entry)."""
    corpus = write_corpus(tmp_path / "big", files=3, sentences=150, seed=1)
    kv = tmp_path / "kv"
    cmd = [sys.executable, "-m", "ragpic.cli", "compile", str(corpus), "--store", str(kv), "--model", model,
           "--chunk-tokens", "32", "--batch", "4", "--threads", "1", "--quiet", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and len(folder_keys(kv) if kv.exists() else ()) < 40:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.stderr.read().decode()[-500:]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    kept = folder_keys(kv)
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-800:]
    report = json.loads(rerun.stdout)
    assert report["ok"] and report["stored_before"] >= len(kept) >= 40
    assert report["compiled"] == report["distinct"] - len(kept) > 0  # only the rest, each chunk once
    assert kept < folder_keys(kv) and len(folder_keys(kv)) == report["distinct"]
    assert main(["store", "check", str(kv)]) == 0


def test_the_demo_finds_every_chunk_compile_stored(model, corpus, tmp_path, embed):
    """`ragpic compile DIR` then `ragpic demo --folder DIR` on the same store: the demo's ingest
    compiles nothing (its index's chunks are the ones compile stored)."""
    from ragpic import Config, RagPic
    from ragpic.demo.corpus import read_folder, source_key
    from ragpic.demo.index import sync_index

    kv = tmp_path / "kv"
    assert main(["compile", str(corpus), "--store", str(kv), "--model", model, "--chunk-tokens", "64", "--quiet"]) == 0
    engine = RagPic(Config(model=model, store=str(kv), device="cpu"))
    _, report = sync_index(engine, tmp_path / "index", read_folder(corpus), source_key(corpus), 64, embed)
    assert report.new_chunks > 20 and report.compiled == 0


def _document_chunks(model: str, corpus: Path, chunk_tokens: int) -> dict[str, list[str]]:
    """Each document's chunk texts, in order, as ``ragpic compile`` cuts them."""
    from transformers import AutoTokenizer

    from ragpic.corpus import read_sources
    from ragpic.corpus.chunking import make_chunker
    from ragpic.corpus.local import cut

    chunker = make_chunker("llamaindex", AutoTokenizer.from_pretrained(model), chunk_tokens)
    return {d.name: [t for _, t in cut(d, chunker)] for d in read_sources([str(corpus)])}


def test_compile_behind_then_a_server_links_the_entries_behind(model, corpus, tmp_path, capsys):
    """`ragpic compile --compile-behind 2` stores, beside each chunk, its entry behind the chunks
    before it in its document; `ragpic serve --compile-behind 2` over that store links them
    where a prompt holds the chunks in order, and the plain ones where it does not."""
    from serve_helpers import Server

    kv = tmp_path / "kv"
    head = ["--compile-head", "Read these.\n\n"]  # what the prompts below put before their chunks
    code, report = compile_json(capsys, str(corpus), "--store", str(kv), "--model", model, "--chunk-tokens", "64",
                                "--compile-behind", "2", *head)
    docs = _document_chunks(model, corpus, 64)
    capsys.readouterr()  # LlamaIndex's splitter prints a warning about the metadata's length
    assert code == 0 and report["ok"] and report["documents"] == len(docs) == 3
    # every chunk is long enough; each document's first is compiled behind the prompt's start alone
    assert report["behind"] == sum(len(c) for c in docs.values()) > 20
    assert len(folder_keys(kv)) == report["distinct"] + report["behind"]
    code, again = compile_json(capsys, str(corpus), "--store", str(kv), "--model", model, "--chunk-tokens", "64",
                               "--compile-behind", "2", *head)
    assert code == 0 and again["compiled"] == again["behind"] == 0
    chunks = next(iter(docs.values()))[:3]
    server = Server("--model", model, "--model-id", "tiny", "--store", str(kv), "--compile-behind", "2", *head,
                    home=tmp_path)
    try:
        with server.client() as c:
            def ask(parts):
                content = "Read these.\n\n" + "\n\n".join(parts) + "\n\nquestion: which fact comes first?"
                r = c.post("/v1/chat/completions", json={"model": "tiny", "max_tokens": 2, "hints": parts,
                                                          "messages": [{"role": "user", "content": content}]})
                assert r.status_code == 200, r.text
                return r.json()["ragpic"]
            in_order, reversed_ = ask(chunks), ask(chunks[::-1])
    finally:
        server.stop()
    assert (in_order["chunks_loaded"], in_order["chunks_behind"]) == (3, 3)
    # reversed, only the document's first chunk finds an entry: the one behind the prompt's start alone
    assert (reversed_["chunks_loaded"], reversed_["chunks_behind"]) == (3, 1)


@pytest.mark.parametrize("args, expect", [
    (["--compile-behind", "2", "--ray"], "--compile-behind runs in process"),
    (["--compile-behind", "17"], "compile_behind must be at most 16"),
    (["--compile-behind", "2", "--method", "legolink-0"], "compile_behind needs a method that links plain chunks"),
    (["--compile-behind", "2", "--compile-head", ""], "compile_head must be True"),
])
def test_compile_behind_refuses_what_it_cannot_do(model, corpus, tmp_path, capsys, args, expect):
    assert main(["compile", str(corpus), "--store", str(tmp_path / "kv"), "--model", model, "--quiet", *args]) == 2
    assert expect in capsys.readouterr().err
    assert not (tmp_path / "kv" / "entries").exists()


def test_dicts_and_strings_are_documents_checked_as_jsonl_lines_are():
    from ragpic.corpus.sources import doc_from, parse_jsonl_line
    from ragpic.errors import UsageError

    given = doc_from({"text": "t", "id": "a", "metadata": {"k": 1}}, 0)
    assert (given.name, given.text, given.metadata) == ("a", "t", {"k": 1})
    line = parse_jsonl_line('{"text": "t", "id": "a", "metadata": {"k": 1}}', "f.jsonl:1")
    assert (line.name, line.text, line.metadata) == (given.name, given.text, given.metadata)
    assert doc_from({"text": "t"}, 3).name == "documents[3]" and doc_from("plain", 4).name == "documents[4]"
    with pytest.raises(UsageError, match=r"documents\[1\]: each line must be a JSON object with a \"text\""):
        doc_from({"body": "no text"}, 1)
    with pytest.raises(UsageError, match=r"documents\[2\]: \"metadata\" must be an object"):
        doc_from({"text": "t", "metadata": ["x"]}, 2)
