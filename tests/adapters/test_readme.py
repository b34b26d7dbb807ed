"""Every Python block of README.md runs as written, offline, on the embedded model.

Each block is a complete program: it runs in a fresh interpreter, in its own temporary
working folder (the indexes and KV stores it makes land there), and must exit 0, print how
the answer was made ("chunks loaded"), and print no deprecation warning. The Redis block
gets a real ``redis-server`` on a free port through ``$RAGPIC_REDIS``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
TIMEOUT_S = 600


def python_blocks() -> list[tuple[str, str]]:
    """``(id, code)`` of every ```python block, the id naming the section it sits in."""
    text = README.read_text()
    out = []
    for i, m in enumerate(BLOCK.finditer(text)):
        heading = re.findall(r"^#+ (.+)$", text[: m.start()], re.M)[-1]
        out.append((f"{i}-{re.sub(r'[^a-z0-9]+', '-', heading.lower()).strip('-')}", m.group(1)))
    return out


BLOCKS = python_blocks()


def test_readme_has_the_blocks_it_promises():
    ids = [b for b, _ in BLOCKS]
    assert len(BLOCKS) >= 5, ids  # core, LlamaIndex x2, LangChain, Redis
    text = README.read_text()
    assert "../shared" not in text  # every command runs from a clone
    for _, code in BLOCKS:
        assert "import" in code, code[:200]  # complete programs, not fragments


@pytest.fixture(scope="module")
def redis_url():
    from redis_server import RedisServer

    server = RedisServer()  # skips when the redis-server binary is absent
    yield server.url
    server.stop()


@pytest.mark.parametrize("block_id, code", BLOCKS, ids=[b for b, _ in BLOCKS])
def test_readme_block_runs(block_id, code, tmp_path, request):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(ROOT)}
    if "RAGPIC_REDIS" in code:
        env["RAGPIC_REDIS"] = request.getfixturevalue("redis_url")
    script = tmp_path / "snippet.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"{block_id} failed:\n{proc.stderr[-4000:]}"
    assert "chunks loaded" in proc.stdout, f"{block_id} does not show the cache stats:\n{proc.stdout}"
    assert "deprecat" not in proc.stderr.lower(), f"{block_id} warns:\n{proc.stderr[-3000:]}"
