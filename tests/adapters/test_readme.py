"""Every Python block of README.md and of the documentation site's pages runs as written, offline,
on the embedded model.

The pages: ``docs/index.md``, ``docs/getting-started.md``, every guide under ``docs/guides/`` and
``docs/reference/config.md`` (the design documents and ``docs/archive/`` are not programs). Each
block is a complete program: it runs in a fresh interpreter, in its own temporary working folder
(the indexes and KV stores it makes land there), and must exit 0 and print no deprecation
warning; a block that makes an engine (``RagPic(...)``, or a server) must also print how the
answer was made ("chunks loaded"). A block the README and a guide share runs once. The Redis
block gets a real ``redis-server`` on a free port through ``$RAGPIC_REDIS``.
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
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
TIMEOUT_S = 600


def pages() -> list[Path]:
    """The Markdown whose Python blocks are programs: the README and the site's user pages."""
    return [README, DOCS / "index.md", DOCS / "getting-started.md", *sorted((DOCS / "guides").glob("*.md")),
            DOCS / "reference" / "config.md"]


def python_blocks(page: Path) -> list[tuple[str, str]]:
    """``(id, code)`` of every ```python block of ``page``, the id naming the page and the section."""
    text = page.read_text()
    name = "readme" if page == README else page.relative_to(DOCS).with_suffix("").as_posix().replace("/", "-")
    out = []
    for i, m in enumerate(BLOCK.finditer(text)):
        heading = re.findall(r"^#+ (.+)$", text[: m.start()], re.M)[-1]
        out.append((f"{name}-{i}-{re.sub(r'[^a-z0-9]+', '-', heading.lower()).strip('-')}", m.group(1)))
    return out


def all_blocks() -> list[tuple[str, str]]:
    """Every page's blocks, each distinct program once (under the first place it appears)."""
    seen: dict[str, str] = {}
    for page in pages():
        for block_id, code in python_blocks(page):
            seen.setdefault(code, block_id)
    return [(block_id, code) for code, block_id in seen.items()]


BLOCKS = all_blocks()


def test_readme_has_the_blocks_it_promises():
    readme = python_blocks(README)
    assert len(readme) >= 3, [b for b, _ in readme]  # core, LlamaIndex, LangChain
    guides = {p.stem: python_blocks(p) for p in sorted((DOCS / "guides").glob("*.md"))}
    for guide in ("llamaindex", "langchain", "serving", "compiling", "stores", "choosing-a-method",
                  "documents-in-order", "troubleshooting"):
        assert guides.get(guide), f"docs/guides/{guide}.md has no Python example"
    for page in pages():
        assert "../shared" not in page.read_text(), page  # every command runs from a clone
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
    if "RagPic(" in code or "ragpic.cli" in code:
        assert "chunks loaded" in proc.stdout, f"{block_id} does not show the cache stats:\n{proc.stdout}"
    assert "deprecat" not in proc.stderr.lower(), f"{block_id} warns:\n{proc.stderr[-3000:]}"
