"""The package's layers, checked from its source: imports flow adapters -> engine -> core.

Every import is counted, including those inside functions and under ``TYPE_CHECKING``: a
function-level import is still a dependency, and is how cycles used to hide. So is what a
package's ``__init__.py`` imports: importing ``ragpic.x.y`` runs ``ragpic/x/__init__.py``
first, so its imports count as the importer's too (:func:`effective_graph`).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "ragpic"

# module prefix -> the ragpic modules it may import (a prefix covers its sub-modules).
# Anything not listed (ragpic.cli, ragpic.demo and other adapters) may import any layer,
# except what FORBIDDEN names; no layer below may import it.
ALLOWED = {
    "ragpic.errors": (),
    "ragpic.paths": (),  # where files live: the bottom, stdlib only
    "ragpic.checks": ("ragpic.errors",),
    "ragpic.core.ops": ("ragpic.core.ops", "ragpic.errors"),
    "ragpic.core.compile_recipe": ("ragpic.errors",),  # stdlib only, as the methods
    "ragpic.core.methods": ("ragpic.core.compile_recipe", "ragpic.core.kv_quant", "ragpic.errors"),  # stdlib-only leaves
    "ragpic.core.kv_quant": ("ragpic.errors",),
    # weight formats: the name table (stdlib), its layers and the GGUF block maps, below the model record
    "ragpic.core.weights.formats": ("ragpic.errors",),
    "ragpic.core.weights": ("ragpic.core.weights", "ragpic.core.ops", "ragpic.core.gguf_header", "ragpic.errors"),
    # below the link (docs/ARCHITECTURE.md §2): chunk KV and segments, the model record, the
    # forward step and decode never import ragpic.core.link
    "ragpic.core.kv": ("ragpic.core.compile_recipe", "ragpic.core.methods", "ragpic.core.ops", "ragpic.errors"),
    "ragpic.core.segments": ("ragpic.core.kv", "ragpic.errors"),
    "ragpic.core.model": ("ragpic.core.default_model", "ragpic.core.fingerprint", "ragpic.core.gguf", "ragpic.core.ops",
                          "ragpic.core.supported", "ragpic.core.weights", "ragpic.errors", "ragpic.paths"),  # paths: the embedded model's file
    "ragpic.core.lean_step": ("ragpic.core.model", "ragpic.core.ops", "ragpic.errors"),
    "ragpic.core.forward": ("ragpic.core.model", "ragpic.core.ops", "ragpic.errors"),
    "ragpic.core.batch": ("ragpic.core.model", "ragpic.core.ops", "ragpic.errors"),
    # the one object that calls a model's modules (docs/ARCHITECTURE.md §4.2)
    "ragpic.core.runner": ("ragpic.core.batch", "ragpic.core.forward", "ragpic.core.lean_step", "ragpic.core.model",
                           "ragpic.core.ops", "ragpic.errors"),
    "ragpic.core.decode": ("ragpic.core.runner", "ragpic.core.model", "ragpic.core.ops", "ragpic.checks", "ragpic.errors"),
    "ragpic.core.link": ("ragpic.core", "ragpic.errors"),
    "ragpic.core": ("ragpic.core", "ragpic.errors", "ragpic.checks", "ragpic.paths"),
    "ragpic.config": ("ragpic.paths", "ragpic.core.methods", "ragpic.core.kv_quant", "ragpic.core.weights",
                      "ragpic.errors", "ragpic.checks"),
    # the argument types, parser and exit codes of both command lines (ragpic.cli, ragpic.demo)
    "ragpic.cmdline": ("ragpic.core.methods", "ragpic.core.kv_quant", "ragpic.core.gguf", "ragpic.errors"),
    # inside the cache, layers flow tools -> store -> backends -> format (ARCHITECTURE §2)
    "ragpic.cache.format": ("ragpic.cache.format", "ragpic.core.compile_recipe", "ragpic.core.kv", "ragpic.core.kv_quant",
                            "ragpic.core.methods",
                            "ragpic.errors"),
    "ragpic.cache.backends": ("ragpic.cache.backends", "ragpic.cache.format", "ragpic.errors"),
    "ragpic.cache.store": ("ragpic.cache.store", "ragpic.cache.backends", "ragpic.cache.format", "ragpic.core.kv",
                           "ragpic.core.kv_quant",
                           "ragpic.core.segments", "ragpic.errors"),
    "ragpic.cache.tools": ("ragpic.cache.tools", "ragpic.cache.backends", "ragpic.cache.format", "ragpic.errors"),
    "ragpic.cache": ("ragpic.cache.format", "ragpic.cache.store"),  # the package itself: its public names
    "ragpic.engine.generation": ("ragpic.core", "ragpic.errors"),
    "ragpic.engine.prompting": ("ragpic.checks", "ragpic.errors"),
    "ragpic.engine.segmenting": ("ragpic.core", "ragpic.checks", "ragpic.errors", "ragpic.engine.generation",
                                 "ragpic.engine.prompting"),
    "ragpic.engine": ("ragpic.engine", "ragpic.core", "ragpic.cache", "ragpic.config", "ragpic.paths",
                      "ragpic.errors", "ragpic.checks"),  # paths: where a model's calibration lives
    # the evaluations and the server run the engine's request; of the core they name types only
    # (test_serve_and_eval_take_only_types_from_the_core)
    "ragpic.eval": ("ragpic.eval", "ragpic.engine", "ragpic.core", "ragpic.cache", "ragpic.config", "ragpic.paths",
                    "ragpic.errors", "ragpic.checks"),
    "ragpic.retriever_hooks": ("ragpic.retriever_hooks", "ragpic.engine", "ragpic.config", "ragpic.errors",
                               "ragpic.checks"),
    "ragpic.llm": ("ragpic.llm", "ragpic.engine", "ragpic.retriever_hooks", "ragpic.config", "ragpic.errors",
                   "ragpic.checks"),
    # corpus ingest (`ragpic compile`): documents -> the frameworks' chunk texts -> the engine's
    # compile; its Ray driver imports ray lazily, and nothing below it imports it
    "ragpic.corpus": ("ragpic.corpus", "ragpic.engine", "ragpic.core", "ragpic.cache", "ragpic.config",
                      "ragpic.retriever_hooks", "ragpic.errors"),
    "ragpic.models": ("ragpic.models", "ragpic.core.gguf", "ragpic.paths", "ragpic.errors"),
    "ragpic.serve": ("ragpic.serve", "ragpic.engine", "ragpic.core", "ragpic.cache", "ragpic.config", "ragpic.paths",
                     "ragpic.errors", "ragpic.checks"),
}
# Top-level ``ragpic/__init__.py`` re-exports the public names.
ALLOWED_TOP = ("ragpic.config", "ragpic.engine", "ragpic.errors")

_ADAPTERS = ("ragpic.cli", "ragpic.demo", "ragpic.serve", "ragpic.engine", "ragpic.eval", "ragpic.llm",
             "ragpic.retriever_hooks", "ragpic.corpus")
# module prefix -> ragpic modules it may never import; every matching prefix applies. For the
# open adapters (ragpic.cli may import anything, so it has no entry) and as a second guard on
# the floors below them, whatever their ALLOWED rows say.
FORBIDDEN = {
    "ragpic.demo": ("ragpic.cli", "ragpic.serve", "ragpic.eval"),
    "ragpic.cmdline": ("ragpic.cli", "ragpic.demo"),
    "ragpic.core": _ADAPTERS + ("ragpic.config",),
    "ragpic.cache": _ADAPTERS,
    "ragpic.config": _ADAPTERS,
    "ragpic.paths": _ADAPTERS,
}


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


def parents(name: str) -> list[str]:
    """The packages whose ``__init__`` runs before ``name`` (not ``ragpic`` itself: its public
    names are lazy, and what it may import is ALLOWED_TOP)."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def effective_graph(g: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """Each module's imports plus what the ``__init__`` of each target's parent packages imports.

    A module's own packages are left out (importing it runs them whoever imports it, and they
    answer to their own rule); so is the module itself when a parent imports it back.
    """
    g = graph() if g is None else g
    out = {}
    for name, targets in g.items():
        own = set(parents(name)) | {name}
        extra = {x for t in targets for p in parents(t) if p not in own and p in g for x in g[p]}
        out[name] = targets | {x for x in extra if x not in own}
    return out


def rule_for(name: str) -> tuple[str, ...] | None:
    if name == "ragpic":
        return ALLOWED_TOP
    best = max((p for p in ALLOWED if name == p or name.startswith(p + ".")), key=len, default=None)
    return None if best is None else ALLOWED[best]


def _covered(target: str, allowed: tuple[str, ...]) -> bool:
    return any(target == a or target.startswith(a + ".") for a in allowed)


def test_every_import_respects_the_layers():
    bad = []
    for name, targets in sorted(effective_graph().items()):
        allowed = rule_for(name)
        if allowed is None:
            continue
        bad += [f"{name} -> {t}" for t in sorted(targets) if not _covered(t, allowed)]
    assert not bad, "forbidden imports:\n" + "\n".join(bad)


def test_the_cache_layers_only_import_downwards():
    # a lower layer of ragpic.cache never imports a higher one, and the base class of the
    # backends imports no implementation
    order = ("ragpic.cache.format", "ragpic.cache.backends", "ragpic.cache.store", "ragpic.cache.tools")
    g = effective_graph()
    for name, targets in g.items():
        mine = [i for i, layer in enumerate(order) if _covered(name, (layer,))]
        for t in targets:
            theirs = [i for i, layer in enumerate(order) if _covered(t, (layer,))]
            assert not (mine and theirs and theirs[0] > mine[0]), f"{name} -> {t}"
    assert not [t for t in g["ragpic.cache.backends.base"] if t.startswith("ragpic.cache.backends")]
    assert not [n for n, ts in effective_graph(g).items()
                if n.startswith("ragpic.core") and any(_covered(t, ("ragpic.cache",)) for t in ts)]


def test_no_floor_imports_what_it_may_not():
    # core, cache, config and paths never reach an adapter or the engine, core never the
    # config, the demo never the CLI (nor the server, nor the evaluations)
    bad = []
    for name, targets in sorted(effective_graph().items()):
        forbidden = tuple(t for p, ts in FORBIDDEN.items() if _covered(name, (p,)) for t in ts)
        bad += [f"{name} -> {t}" for t in sorted(targets) if _covered(t, forbidden)]
    assert not bad, "forbidden imports:\n" + "\n".join(bad)
    assert rule_for("ragpic.cli.main") is None and not _covered("ragpic.cli.main", tuple(FORBIDDEN))


def test_a_parent_package_init_counts_as_imported(tmp_path):
    # importing ragpic.cache.backends.spec runs ragpic/cache/__init__.py, which imports the
    # store: a core module doing it would depend on the cache, and is refused
    f = tmp_path / "x.py"
    f.write_text("from ragpic.cache.backends.spec import parse_store\n")
    g = graph()
    g["ragpic.core.x"] = imports_of("ragpic.core.x", f, set(g))
    edges = effective_graph(g)["ragpic.core.x"]
    assert "ragpic.cache.store.opening" in edges and "ragpic.cache.backends.disk" in edges
    assert not all(_covered(t, rule_for("ragpic.core.x")) for t in edges)
    # a module's own packages are not its importer's business
    assert "ragpic.cache.store.opening" not in effective_graph(g)["ragpic.cache.backends.spec"]


def test_the_store_kinds_table_names_tools_that_exist():
    # the table sits in the backends layer and names the tools' functions instead of importing
    # them: each name must be a function of a ragpic.cache.tools module, read from its source
    from ragpic.cache.backends.kinds import KINDS

    mods = modules()
    for kind in KINDS.values():
        for ref in (kind.check, kind.report):
            if ref is None:
                continue
            module, _, name = ref.partition(":")
            assert _covered(module, ("ragpic.cache.tools",)) and module in mods, ref
            tree = ast.parse(mods[module].read_text())
            assert name in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, ref


def test_ray_is_imported_only_inside_the_ray_driver_s_functions():
    # the `ray` extra is optional: `pip install ragpic` without it must import every module, so
    # only ragpic/corpus/on_ray.py names ray, and only inside its functions (ARCHITECTURE §2)
    seen = []
    for name, path in modules().items():
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n == "ray" or n.startswith("ray.") for n in names):
                seen.append(name)
                assert name == "ragpic.corpus.on_ray" and id(node) not in top, f"{name} imports ray"
    assert seen, "the Ray driver no longer imports ray: update this test"


# What ragpic.serve and ragpic.eval may take from ragpic.core: type names (for annotations and
# the records they read), never a function that runs part of the pipeline: that is the engine's.
CORE_TYPES = {"ChunkKV", "KVQuant", "LinkResult", "LoadedModel", "Method", "Sampling", "Segment", "SlabPool"}
# The evaluations' edge parses the method names a command line gives (ragpic/eval/variants.py), and
# the calibration names the presets it measures by default.
CORE_EDGE = {"ragpic.eval.variants": {"parse_variant"}, "ragpic.eval.calibrate": {"PRESETS", "parse_variant"}}


def core_names_imported(name: str, path: Path) -> set[str]:
    """``module:name`` of every name ``path`` imports from ``ragpic.core`` (anywhere in the file);
    ``module:*`` for a plain ``import ragpic.core...``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ragpic.core"):
            out |= {f"{node.module}:{a.name}" for a in node.names if a.name not in CORE_EDGE.get(name, ())}
        elif isinstance(node, ast.Import):
            out |= {f"{a.name}:*" for a in node.names if a.name.startswith("ragpic.core")}
    return out


def test_serve_and_eval_take_only_types_from_the_core():
    bad = []
    for name, path in sorted(modules().items()):
        if name.startswith(("ragpic.serve", "ragpic.eval")):
            bad += [f"{name} imports {n}" for n in sorted(core_names_imported(name, path))
                    if n.split(":")[1] not in CORE_TYPES]
    assert not bad, "the server and the evaluations run the engine, not the core:\n" + "\n".join(bad)


def test_the_type_check_sees_a_core_function(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from ragpic.core.link import link\n    import ragpic.core.decode\n")
    assert core_names_imported("ragpic.serve.x", f) == {"ragpic.core.link:link", "ragpic.core.decode:*"}


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


# A model's parts, reached past the runner: its decoder, layers, embedding, rotary embedding, head
# or a whole forward. The weights code names tensors by their checkpoint keys, which is no call.
_MODEL_PARTS = re.compile(r"\bbase_model\b|\bdecoder\.layers\b|\bembed_tokens\(|\brotary_emb\(|get_output_embeddings"
                          r"|\blm_head\(|\blm\.model\(|\.model\.model\b")
_RUNNER = ("core/runner.py", "core/lean_step.py")


def test_only_the_model_runner_calls_a_models_modules():
    """One module walks the model's layers and computes its head (docs/ARCHITECTURE.md §4.2)."""
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel in _RUNNER or rel.startswith("core/weights/"):
            continue
        bad += [f"{rel}:{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
                if _MODEL_PARTS.search(line.split("#")[0])]
    assert not bad, "model modules called outside core/runner.py:\n" + "\n".join(bad)
    assert _MODEL_PARTS.search("hidden = base.embed_tokens(ids)") and _MODEL_PARTS.search("lm.model(input_ids=x)")


# What compiles chunks or writes their entries: the core's compile functions and the store's halves
_COMPILE_CALLS = {"compile_chunks", "compile_in_context", "put_many", "encode_many"}


def test_one_function_compiles_and_stores_chunks_above_the_core():
    """The engine, the corpus compile, the server and the evaluations compile and store chunks
    through ragpic/engine/compile_pipeline.py alone (one batching policy, one error, one writer);
    the server's long chunk continues one prefill in parts (``ChunkInParts``) and nothing else."""
    bad = []
    for folder in ("engine", "corpus", "serve", "eval", "llm", "retriever_hooks", "cli"):
        for path in sorted((PKG / folder).rglob("*.py")):
            rel = path.relative_to(PKG).as_posix()
            if rel == "engine/compile_pipeline.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    f = node.func
                    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                    store_write = (isinstance(f, ast.Attribute) and f.attr == "write"
                                   and "store" in ast.unparse(f.value))
                    if name in _COMPILE_CALLS or store_write:
                        bad.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not bad, "compiled outside engine/compile_pipeline.py:\n" + "\n".join(bad)


def test_no_module_is_over_300_lines():
    """Small modules whose names say what they hold (the developers' guide, *Code style*)."""
    long = [f"{p.relative_to(PKG).as_posix()}: {n}" for p in sorted(PKG.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 300]
    assert not long, "modules over 300 lines (split them by what they hold):\n" + "\n".join(long)
