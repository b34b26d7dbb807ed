"""The package's layers, checked from its source: imports flow adapters -> engine -> core.

Every import is counted, including those inside functions and under ``TYPE_CHECKING``: a
function-level import is still a dependency, and is how cycles used to hide.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "ragpic"

# module prefix -> the ragpic modules it may import (a prefix covers its sub-modules).
# Anything not listed (cli, demo, server and other adapters) may import any layer, and no
# layer below may import it.
ALLOWED = {
    "ragpic.errors": (),
    "ragpic.checks": ("ragpic.errors",),
    "ragpic.core.ops": ("ragpic.core.ops", "ragpic.errors"),
    "ragpic.core.methods": ("ragpic.errors",),
    # below the link (docs/ARCHITECTURE.md §2): chunk KV and segments, the model record, the
    # forward step and decode never import ragpic.core.link
    "ragpic.core.kv": ("ragpic.core.methods", "ragpic.core.ops", "ragpic.errors"),
    "ragpic.core.segments": ("ragpic.core.kv", "ragpic.errors"),
    "ragpic.core.model": ("ragpic.core.default_model", "ragpic.core.fingerprint", "ragpic.core.gguf", "ragpic.core.ops",
                          "ragpic.errors"),
    "ragpic.core.forward": ("ragpic.core.model", "ragpic.core.ops", "ragpic.errors"),
    "ragpic.core.decode": ("ragpic.core.forward", "ragpic.core.model", "ragpic.core.ops", "ragpic.checks",
                           "ragpic.errors"),
    "ragpic.core.link": ("ragpic.core", "ragpic.errors"),
    "ragpic.core": ("ragpic.core", "ragpic.errors", "ragpic.checks", "ragpic.config"),
    "ragpic.config": ("ragpic.core.methods", "ragpic.errors", "ragpic.checks"),
    # inside the cache, layers flow tools -> store -> backends -> format (ARCHITECTURE §2)
    "ragpic.cache.format": ("ragpic.cache.format", "ragpic.core.kv", "ragpic.core.methods",
                            "ragpic.errors"),
    "ragpic.cache.backends": ("ragpic.cache.backends", "ragpic.cache.format", "ragpic.errors"),
    "ragpic.cache.store": ("ragpic.cache.store", "ragpic.cache.backends", "ragpic.cache.format", "ragpic.core.kv",
                           "ragpic.core.segments", "ragpic.errors"),
    "ragpic.cache.tools": ("ragpic.cache.tools", "ragpic.cache.backends", "ragpic.cache.format", "ragpic.errors"),
    "ragpic.cache": ("ragpic.cache.format", "ragpic.cache.store"),  # the package itself: its public names
    "ragpic.engine.generation": ("ragpic.core", "ragpic.errors"),
    "ragpic.engine.prompting": ("ragpic.checks", "ragpic.errors"),
    "ragpic.engine.segmenting": ("ragpic.core", "ragpic.checks", "ragpic.errors", "ragpic.engine.generation",
                                 "ragpic.engine.prompting"),
    "ragpic.engine": ("ragpic.engine", "ragpic.core", "ragpic.cache", "ragpic.config", "ragpic.errors",
                      "ragpic.checks"),
    "ragpic.eval": ("ragpic.eval", "ragpic.core", "ragpic.cache", "ragpic.config", "ragpic.errors", "ragpic.checks"),
    "ragpic.retriever_hooks": ("ragpic.retriever_hooks", "ragpic.engine", "ragpic.config", "ragpic.errors",
                               "ragpic.checks"),
    "ragpic.llm": ("ragpic.llm", "ragpic.engine", "ragpic.retriever_hooks", "ragpic.config", "ragpic.errors",
                   "ragpic.checks"),
    "ragpic.models": ("ragpic.models", "ragpic.core.gguf", "ragpic.config", "ragpic.errors"),
    "ragpic.serve": ("ragpic.serve", "ragpic.engine", "ragpic.core", "ragpic.cache", "ragpic.config",
                     "ragpic.errors", "ragpic.checks"),
}
# Top-level ``ragpic/__init__.py`` re-exports the public names.
ALLOWED_TOP = ("ragpic.config", "ragpic.engine", "ragpic.errors")


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The ragpic modules ``name`` imports anywhere in its file (resolved, de-duplicated)."""
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            # `from pkg import sub` imports the sub-module when there is one
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        out.update(t for t in targets if t and (t == "ragpic" or t.startswith("ragpic.")))
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def rule_for(name: str) -> tuple[str, ...] | None:
    if name == "ragpic":
        return ALLOWED_TOP
    best = max((p for p in ALLOWED if name == p or name.startswith(p + ".")), key=len, default=None)
    return None if best is None else ALLOWED[best]


def _covered(target: str, allowed: tuple[str, ...]) -> bool:
    return any(target == a or target.startswith(a + ".") for a in allowed)


def test_every_import_respects_the_layers():
    bad = []
    for name, targets in sorted(graph().items()):
        allowed = rule_for(name)
        if allowed is None:
            continue
        bad += [f"{name} -> {t}" for t in sorted(targets) if not _covered(t, allowed)]
    assert not bad, "forbidden imports:\n" + "\n".join(bad)


def test_the_cache_layers_only_import_downwards():
    # a lower layer of ragpic.cache never imports a higher one, and the base class of the
    # backends imports no implementation
    order = ("ragpic.cache.format", "ragpic.cache.backends", "ragpic.cache.store", "ragpic.cache.tools")
    g = graph()
    for name, targets in g.items():
        mine = [i for i, layer in enumerate(order) if _covered(name, (layer,))]
        for t in targets:
            theirs = [i for i, layer in enumerate(order) if _covered(t, (layer,))]
            assert not (mine and theirs and theirs[0] > mine[0]), f"{name} -> {t}"
    assert not [t for t in g["ragpic.cache.backends.base"] if t.startswith("ragpic.cache.backends")]
    assert not [n for n, ts in g.items() if n.startswith("ragpic.core") and any(_covered(t, ("ragpic.cache",))
                                                                                for t in ts)]


def test_core_and_cache_never_import_an_adapter_or_the_engine():
    forbidden = ("ragpic.llm", "ragpic.retriever_hooks", "ragpic.eval", "ragpic.engine", "ragpic.cli", "ragpic.serve",
                 "ragpic.demo")
    for name, targets in graph().items():
        if name.startswith(("ragpic.core", "ragpic.cache")):
            assert not [t for t in targets if _covered(t, forbidden)], name


def test_no_import_cycles():
    g = graph()
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                cycle = stack[stack.index(m):] + [m]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if m in g and m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            visit(n)


def test_the_checker_sees_function_level_relative_and_type_checking_imports(tmp_path):
    # the rules are only as good as the parser: each way of hiding an edge must be found
    f = tmp_path / "x.py"  # parsed as if it were ragpic/core/x.py
    f.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ragpic.eval import bench\n"
                 "def f():\n    from ..engine import RagPic\n    import ragpic.llm.langchain\n"
                 "    from . import link\n")
    edges = imports_of("ragpic.core.x", f, set(modules()))
    assert edges == {"ragpic.eval.bench", "ragpic.engine", "ragpic.llm.langchain", "ragpic.core.link"}
    assert not _covered("ragpic.engine", rule_for("ragpic.core.x"))


def test_import_ragpic_and_its_config_does_not_import_torch():
    code = ("import ragpic, ragpic.config, ragpic.errors, sys; ragpic.Config(); ragpic.kv_folder('i');"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
