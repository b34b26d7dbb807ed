"""The command line explains itself: every wrong argument fails fast, in one line, with exit code 2,
before any model is loaded, leaving no folder behind; every command has a description; the
defaults need no path outside the package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# One subprocess runs every case (each through ragpic.cli.main, stderr captured), then reports
# whether torch was ever imported: it must not be, so no model was loaded for any of them.
_RUNNER = r"""
import contextlib, io, json, sys
from ragpic.cli import main
out = {}
for name, argv in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    out[name] = {"rc": rc, "stderr": err.getvalue()}
out["_torch_imported"] = "torch" in sys.modules
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ragpic_home")


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> Path:
    """A folder with one good file, plus variants with a broken link and a non-UTF-8 file."""
    root = tmp_path_factory.mktemp("cases")
    good = root / "good"
    good.mkdir()
    (good / "a.txt").write_text("Dolores Park is in San Francisco.")
    broken = root / "broken_link"
    broken.mkdir()
    (broken / "a.txt").write_text("fine")
    (broken / "gone.txt").symlink_to(root / "does-not-exist.txt")
    binary = root / "binary"
    binary.mkdir()
    (binary / "b.txt").write_bytes(b"\xff\xfe\x00 not utf-8 \x80")
    (root / "empty").mkdir()
    other = root / "other_index"  # the demo index of another folder with the same base name
    other.mkdir()
    (other / "ragpic_manifest.json").write_text(json.dumps({"version": 1, "source": "/elsewhere/good", "files": {}}))
    return root


def _cases(docs: Path) -> dict[str, list[str]]:
    good = str(docs / "good")
    return {
        "demo bad method": ["demo", "--folder", good, "--method", "legolink16"],
        "demo top-k 0": ["demo", "--folder", good, "--top-k", "0"],
        "demo missing folder": ["demo", "--folder", str(docs / "elsewhere" / "sf_docs")],
        "demo empty folder": ["demo", "--folder", str(docs / "empty")],
        "demo folder is a file": ["demo", "--folder", str(docs / "good" / "a.txt")],
        "demo unreadable file (broken link)": ["demo", "--folder", str(docs / "broken_link")],
        "demo unreadable file (not UTF-8)": ["demo", "--folder", str(docs / "binary")],
        "demo index of another folder": ["demo", "--folder", good, "--index", str(docs / "other_index")],
        "demo index not an index": ["demo", "--folder", good, "--index", str(docs)],
        "demo missing model": ["demo", "--folder", good, "--model", "./no-such-model"],
        "eval bad method": ["eval", "--methods", "full,legolonk-16"],
        "eval limit 0": ["eval", "--limit", "0"],
        "eval missing dataset": ["eval", "--dataset", str(docs / "nope.json")],
        "eval bad dataset": ["eval", "--dataset", str(docs / "good" / "a.txt")],
        "eval bad chunking": ["eval", "--chunking", "tokens:zero"],
        "needle depth 2": ["eval", "needle", "--depths", "0,2"],
        "needle missing haystack": ["eval", "needle", "--haystack", str(docs / "nope")],
        "ruler bad task": ["eval", "ruler", "--tasks", "niah,vt"],
        "ruler missing haystack": ["eval", "ruler", "--haystack", str(docs / "nope")],
        "bench bad length": ["bench", "--context-tokens", "1024,lots"],
        "bench context below query": ["bench", "--context-tokens", "100", "--query-tokens", "200"],
        "bench bad device": ["bench", "--device", "gpu"],
        "unknown command": ["frobnicate"],
    }


@pytest.fixture(scope="module")
def results(docs, home) -> dict:
    env = {**os.environ, "RAGPIC_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(_cases(docs))], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_no_case_loaded_torch_or_wrote_a_folder(results, home):
    assert results["_torch_imported"] is False  # every argument was checked before any model load
    assert not (home / "demo").exists(), list(home.rglob("*"))


@pytest.mark.parametrize("case", list(_cases(Path("/x"))))
def test_usage_error_is_one_line_with_exit_code_2(case, results):
    r = results[case]
    lines = r["stderr"].strip().splitlines()
    assert r["rc"] == 2, r
    assert len(lines) == 1 and "Traceback" not in r["stderr"], r["stderr"]
    assert lines[0].startswith("ragpic") and ": error: " in lines[0], lines[0]


@pytest.mark.parametrize("case, words", [
    ("demo bad method", ["--method", "legolink-16"]),
    ("demo top-k 0", ["--top-k", ">= 1"]),
    ("demo missing folder", ["--folder", "no such folder"]),
    ("demo unreadable file (broken link)", ["gone.txt", "cannot read"]),
    ("demo unreadable file (not UTF-8)", ["b.txt", "UTF-8"]),
    ("demo index of another folder", ["--index", "another --index"]),
    ("eval limit 0", ["--limit"]),
    ("eval bad dataset", ["--dataset", "JSON"]),
    ("needle depth 2", ["--depths", "[0, 1]"]),
    ("ruler bad task", ["--tasks", "niah_single"]),
    ("ruler missing haystack", ["--haystack"]),
    ("bench context below query", ["--context-tokens", "--query-tokens"]),
])
def test_message_names_the_argument_and_what_to_pass(case, words, results):
    for w in words:
        assert w in results[case]["stderr"], (w, results[case]["stderr"])


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads files without permission")
def test_file_without_read_permission(tmp_path, capsys):
    from ragpic.cli import main

    (tmp_path / "secret.txt").write_text("x")
    (tmp_path / "secret.txt").chmod(0)
    assert main(["demo", "--folder", str(tmp_path)]) == 2
    assert "cannot read secret.txt" in capsys.readouterr().err


def test_every_command_has_a_description(capsys):
    from ragpic.cli import main

    for argv in (["--help"], ["demo", "--help"], ["eval", "--help"], ["eval", "needle", "--help"],
                 ["eval", "ruler", "--help"], ["bench", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
        text = capsys.readouterr().out
        usage, _, rest = text.partition("\n\n")
        assert usage.startswith("usage:") and len(rest.split("\n\n")[0]) > 60, (argv, text[:300])


def test_defaults_need_no_path_outside_the_package():
    from ragpic.cli import parse
    from ragpic.eval.data import default_dataset, default_haystack

    pkg = ROOT / "ragpic"
    assert default_dataset().is_relative_to(pkg) and default_haystack().is_relative_to(pkg)
    assert len(parse(["eval"]).examples) == 32  # the documented MuSiQue run's questions
    assert len(parse(["eval", "--limit", "2"]).examples) == 2
    for argv in (["eval", "needle", "--lengths", "8192"], ["eval", "ruler", "--lengths", "8192"],
                 ["bench", "--context-tokens", "8192"]):
        assert Path(parse(argv).haystack) == default_haystack()
    chars = sum(p.stat().st_size for p in default_haystack().glob("*.txt"))
    assert chars > 4 * 8192 + 8192  # ~4 characters per token: an 8k-token prompt fits with room


def test_no_library_code_points_outside_the_repository():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "ragpic").rglob("*.py")
                 if "../shared" in p.read_text() or "shared/data" in p.read_text()]
    assert not offenders, offenders


def test_package_data_ships_what_the_defaults_read():
    import tomllib

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["ragpic"]
    pkg = ROOT / "ragpic"
    shipped = {p for g in globs for p in pkg.glob(g)}
    data = {p for p in (pkg / "data").rglob("*") if p.is_file()}
    assert data <= shipped, sorted(str(p) for p in data - shipped)
