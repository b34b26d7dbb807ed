"""The demo's FAISS index: one per source folder, kept in step with the folder's files.

An index lives in ``~/.cache/ragpic/demo/<name>-<hash of the folder's resolved path>`` (two
folders with the same base name never share one), with the compiled KV in its ``kv/``
subfolder and a manifest (:mod:`ragpic.demo.corpus`) of the files it holds. On every run the
folder is compared with the manifest: nodes of unchanged files are kept as they are (their
embeddings are read back from FAISS, their KV stays in the store), files that were added or
changed are split, embedded and compiled, and the nodes of changed or removed files are
dropped. The new index is persisted, then the manifest.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragpic.paths import cache_dir
from ragpic.demo.corpus import BUNDLED, Changes, SourceFile, describe, diff_files, load_manifest, save_manifest

if TYPE_CHECKING:
    from ragpic.engine.engine import RagPic


def demo_home() -> Path:
    """Where demo indexes live by default: ``<ragpic cache>/demo``."""
    return cache_dir() / "demo"


def default_index_folder(source: str) -> Path:
    """The index folder of a source (a resolved folder path, or the bundled corpus)."""
    name = "bundled-showcase" if source == BUNDLED else re.sub(r"[^A-Za-z0-9._-]+", "_", Path(source).name) or "root"
    return demo_home() / f"{name}-{hashlib.sha256(source.encode()).hexdigest()[:12]}"


@dataclass(slots=True)
class SyncReport:
    """What :func:`sync_index` did; ``line`` is the one-line summary the demo prints."""

    changes: Changes
    new_chunks: int
    compiled: int
    dropped: int

    @property
    def line(self) -> str:
        return describe(self.changes, self.new_chunks, self.compiled, self.dropped)


def _splitter(engine: "RagPic", chunk_tokens: int):
    from ragpic.corpus.chunking import llamaindex_splitter

    return llamaindex_splitter(engine.lm.tokenizer, chunk_tokens)  # as `ragpic compile` cuts a folder


def _split(files: list[SourceFile], splitter) -> dict[str, list]:
    """Nodes of each file (the document id is the file's name, so nodes say where they came from)."""
    from llama_index.core import Document

    return {f.name: splitter.get_nodes_from_documents([Document(text=f.text, id_=f.name, metadata=dict(f.metadata))])
            for f in files}


def _kept_nodes(folder: Path, names: list[str], recorded: dict, embed) -> list:
    """Nodes of unchanged files from the persisted index, with their embeddings read back from FAISS."""
    from ragpic.retriever_hooks.llamaindex import load_faiss_index

    if not names:
        return []
    old = load_faiss_index(folder, embed_model=embed)
    faiss_index = old.vector_store.client
    row_of = {node_id: int(row) for row, node_id in old.index_struct.nodes_dict.items()}
    kept = []
    for name in names:
        for node_id in recorded[name]["nodes"]:
            node = old.docstore.get_node(node_id)
            if node_id in row_of:  # else it is embedded again below (cheap), never lost
                node.embedding = faiss_index.reconstruct(row_of[node_id]).tolist()
            kept.append(node)
    return kept


def _build(nodes: list, embed) -> Any:
    import faiss
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.vector_stores.faiss import FaissVectorStore

    dim = len(embed.get_text_embedding("dimension probe"))
    storage = StorageContext.from_defaults(vector_store=FaissVectorStore(faiss_index=faiss.IndexFlatL2(dim)))
    return VectorStoreIndex(nodes, storage_context=storage, embed_model=embed)  # embeds nodes lacking one


def sync_index(engine: "RagPic", folder: Path, corpus: list[SourceFile], source: str, chunk_tokens: int,
               embed) -> tuple[Any, SyncReport]:
    """Open the index of ``corpus`` in ``folder``, ingesting only what changed since the last run."""
    from ragpic.retriever_hooks.llamaindex import compile_index, load_faiss_index, node_text, persist_index

    manifest = load_manifest(folder)
    same_recipe = bool(manifest) and (manifest.get("source"), manifest.get("model"),
                                      manifest.get("chunk_tokens")) == (source, engine.lm.fingerprint, chunk_tokens)
    recorded = manifest["files"] if same_recipe else {}  # another model or chunk size: ingest all again
    changes = diff_files(recorded, corpus)
    if not changes.to_ingest and not changes.removed:
        index = load_faiss_index(folder, embed_model=embed)
        compiled = compile_index(index, engine, progress=False)  # KV missing from the store (e.g. --store)
        return index, SyncReport(changes, 0, compiled, 0)

    kept = _kept_nodes(folder, changes.unchanged, recorded, embed)
    by_name = {f.name: f for f in corpus}
    new = _split([by_name[n] for n in changes.to_ingest], _splitter(engine, chunk_tokens))
    new_nodes = [node for name in changes.to_ingest for node in new[name]]
    compiled = engine.compile([node_text(n) for n in new_nodes], progress=len(new_nodes) > 1)
    engine.compile([node_text(n) for n in kept])  # normally 0: their KV is in the store already
    index = _build(kept + new_nodes, embed)
    persist_index(index, folder)
    nodes_of = {name: recorded[name]["nodes"] for name in changes.unchanged}
    nodes_of.update({name: [n.node_id for n in new[name]] for name in changes.to_ingest})
    save_manifest(folder, {
        "source": source, "model": engine.lm.fingerprint, "chunk_tokens": chunk_tokens,
        "files": {f.name: {"size": f.size, "sha256": f.sha256, "nodes": nodes_of[f.name]} for f in corpus},
    })
    dropped = sum(len(recorded[n]["nodes"]) for n in changes.to_drop)
    return index, SyncReport(changes, len(new_nodes), compiled, dropped)

