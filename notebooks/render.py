"""Execute the notebooks and commit-ready their outputs: text kept, images moved to docs/img.

    OMP_NUM_THREADS=1 .venv/bin/python notebooks/render.py            # all four
    OMP_NUM_THREADS=1 .venv/bin/python notebooks/render.py 03_why_legolink_works.ipynb

Each notebook runs top to bottom with a real Jupyter kernel on this interpreter, with
``RAGPIC_NB_OUT=../docs/img`` so its plots refresh the committed PNGs (a markdown cell under
every plot shows that file). The notebook is then written back with its text outputs and
execution counts, but without embedded images, stderr (progress bars, library notices) or
execution timings, so it stays small and a
reader on GitHub sees the results without running anything. This is the only thing that
writes into the repository: a notebook run any other way (or by the test suite) writes its
plots to a temp folder.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import nbclient
import nbformat

NB_DIR = Path(__file__).resolve().parent
KERNEL = "ragpic-render-python"
KEEP_MIME = ("text/plain", "text/markdown")
MAX_TEXT = 4000  # characters of one output kept; long ones are cut (the notebooks print little)


def kernel_dir() -> str:
    """A kernelspec that starts this interpreter (so the kernel sees this venv's ragpic)."""
    root = Path(tempfile.mkdtemp(prefix="ragpic-render-jupyter-"))
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "ragpic", "language": "python"}))
    return str(root)


def slim(nb) -> None:
    """Drop images, stderr (progress bars, library warnings) and timing metadata; cut very long text."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.metadata.pop("execution", None)
        kept = []
        for out in cell.outputs:
            if out.output_type in ("display_data", "execute_result"):
                out.data = {k: v for k, v in out.data.items() if k in KEEP_MIME}
                if not out.data or set(out.data) == {"text/plain"} and out.data["text/plain"].startswith("<Figure"):
                    continue  # the figure itself is in docs/img, linked under the cell
                out.metadata = {}
            if out.output_type == "stream" and out.name == "stderr":
                continue  # "Loading weights" bars and tqdm notices: noise in a committed notebook
            if out.output_type == "stream" and len(out.text) > MAX_TEXT:
                out.text = out.text[:MAX_TEXT] + "\n[... cut by notebooks/render.py]\n"
            kept.append(out)
        cell.outputs = kept


def render(name: str) -> None:
    path = NB_DIR / name
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name=KERNEL, resources={"metadata": {"path": str(NB_DIR)}})
    client.execute()
    slim(nb)
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nbformat.write(nb, path)
    print(f"rendered {name} ({path.stat().st_size // 1024} KiB)")


def main(names: list[str]) -> int:
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [kernel_dir(), os.environ.get("JUPYTER_PATH")]))
    os.environ["RAGPIC_NB_OUT"] = "../docs/img"  # relative to the kernel's folder, notebooks/
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    for name in names or sorted(p.name for p in NB_DIR.glob("*.ipynb")):
        render(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
