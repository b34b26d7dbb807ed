"""The documentation site builds with ``mkdocs build --strict`` (no broken link or anchor, no missing
reference), has the sections it promises, and its generated reference covers the code; the
README stays short and every link in it resolves. No model is loaded (the build imports only
what ``ragpic --help`` imports, plus the modules the API reference documents).
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built strictly into a temporary folder (never into the repository)."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, ("mkdocs build --strict failed (`pip install -e '.[docs]'` if mkdocs is "
                                  f"missing):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return out


def test_the_site_builds_strictly_with_every_section(site):
    nav = (ROOT / "mkdocs.yml").read_text()
    for title in ("Getting started", "Guides", "LlamaIndex", "LangChain", "Notebooks", "Serving",
                  "Compiling a corpus", "Models", "Stores", "Choosing a method", "Documents read in order",
                  "Troubleshooting", "Reference", "Python API", "Command line", "Config fields", "Results",
                  "Design", "Architecture"):
        assert re.search(rf"^\s*- {re.escape(title)}:", nav, re.M), f"mkdocs.yml's nav has no {title!r}"
    for page in ("index.html", "getting-started/index.html", "guides/choosing-a-method/index.html",
                 "RESULTS/index.html", "ARCHITECTURE/index.html", "SERVING/index.html",
                 "archive/notebook/index.html"):
        assert (site / page).is_file(), page


def test_the_api_reference_covers_what_a_user_calls(site):
    html = "".join(p.read_text() for p in (site / "reference").rglob("*.html"))
    for name in ("ragpic.Config", "ragpic.RagPic", "ragpic.RagPic.generate", "ragpic.RagPic.compile",
                 "ragpic.RagPic.stream", "ragpic.Generation", "ragpic.kv_folder",
                 "ragpic.llm.llamaindex.RagPicLLM", "ragpic.llm.llamaindex.make_query_engine",
                 "ragpic.retriever_hooks.llamaindex.RagPicIngest", "ragpic.retriever_hooks.llamaindex.compile_index",
                 "ragpic.retriever_hooks.llamaindex.DocumentOrder", "ragpic.retriever_hooks.llamaindex.qa_head",
                 "ragpic.llm.langchain.ChatRagPic", "ragpic.llm.langchain.RagPicLLM",
                 "ragpic.retriever_hooks.langchain.faiss_from_documents",
                 "ragpic.retriever_hooks.langchain.compile_vectorstore",
                 "ragpic.retriever_hooks.langchain.document_order", "ragpic.retriever_hooks.langchain.with_neighbours",
                 "ragpic.cache.open_store", "ragpic.corpus.compile_corpus", "ragpic.corpus.CompileJob",
                 "ragpic.errors.ConfigError", "ragpic.errors.ContextOverflowError"):
        assert f'id="{name}"' in html, f"the API reference does not document {name}"


def test_every_public_object_has_a_docstring():
    import importlib
    import inspect

    missing = []
    for module in ("ragpic", "ragpic.errors", "ragpic.llm.llamaindex", "ragpic.llm.langchain",
                   "ragpic.retriever_hooks.llamaindex", "ragpic.retriever_hooks.langchain", "ragpic.cache",
                   "ragpic.corpus", "ragpic.engine"):
        mod = importlib.import_module(module)
        for name in mod.__all__:
            if name.startswith("__"):
                continue
            obj = getattr(mod, name)
            doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
            if not (doc or "").strip():
                missing.append(f"{module}.{name}")
    assert not missing, f"public objects without a docstring (the API reference would be empty): {missing}"


def test_the_command_line_reference_is_every_command(site):
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import reference
    finally:
        sys.path.pop(0)
    html = (site / "reference" / "cli" / "index.html").read_text()
    names = [name for name, _ in reference.commands()]
    for must in ("ragpic demo", "ragpic compile", "ragpic eval", "ragpic eval needle", "ragpic eval ruler",
                 "ragpic bench", "ragpic calibrate", "ragpic store check", "ragpic store stats", "ragpic store plan",
                 "ragpic serve", "ragpic model get", "ragpic model list"):
        assert must in names, f"{must} is not walked from the parser: {names}"
    for name in names:
        assert f"<code>{name}</code>" in html, f"{name} is missing from the command-line page"
    assert "--context-tokens" in html and "--compile-behind" in html  # the help texts themselves


def test_the_config_reference_is_every_field(site):
    from ragpic.config import Config

    html = (site / "reference" / "config" / "index.html").read_text()
    for f in dataclasses.fields(Config):
        assert f"<code>{f.name}</code>" in html, f"Config.{f.name} is missing from the Config fields page"


def github_slug(heading: str) -> str:
    """The anchor GitHub (and the site, for these headings) gives a Markdown heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {github_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_the_readme_is_short_and_every_link_resolves():
    text = README.read_text()
    assert len(text.splitlines()) <= 300, f"README.md has {len(text.splitlines())} lines (at most 300)"
    broken = []
    for m in LINK.finditer(text):
        target = m.group(1) or m.group(2)
        if re.match(r"https?://", target):
            continue
        path, _, anchor = target.partition("#")
        file = (ROOT / path) if path else README
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors_of(file):
            broken.append(target)
    assert not broken, f"README links that do not resolve: {broken}"
