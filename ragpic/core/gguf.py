"""Any GGUF file as a model: read its header, refuse what cannot load, dequantize once, cache.

``Config(model="x.gguf")`` lands here (docs/ARCHITECTURE.md §2). The header is read
first, in well under a second, so an architecture ragpic cannot link or a file cut short is
refused before gigabytes are dequantized. A file that passes is dequantized by transformers'
GGUF reader to the requested dtype once and saved as a Hugging Face folder (safetensors,
config, tokenizer) under ``cache_dir()/models/gguf/``, keyed by the file's SHA-256 and the
dtype: a renamed or moved copy of the same file reuses the folder, an edited file does not.

The header parser lives in :mod:`ragpic.core.gguf_header`; torch and transformers are
imported only when a conversion actually runs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ragpic.paths import cache_dir
from ragpic.core.gguf_header import GGUFHeader, read_header
from ragpic.errors import ModelFileError, UnsupportedModelError

__all__ = ["GGUF_ARCHITECTURES", "GGUFHeader", "check_gguf", "convert_gguf", "file_sha256", "gguf_model_dir", "known_sha256",
           "is_gguf_path", "read_header"]

# GGUF ``general.architecture`` values ragpic converts: transformers' GGUF reader reads them AND
# ragpic links them exactly (core.model.SUPPORTED_MODEL_TYPES). Gemma is linkable but
# transformers reads only gemma2/gemma3 GGUF files, which ragpic does not link.
GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
_HASH_BLOCK = 8 << 20
_SHOW_PROGRESS_FROM = 256 << 20  # hashing a file smaller than this takes under a second


def is_gguf_path(value: str | os.PathLike | None) -> bool:
    """True when ``value`` names a ``.gguf`` file (by its suffix; existence is checked later)."""
    return value is not None and str(value).lower().endswith(".gguf")


def check_gguf(path: str | os.PathLike, option: str = "model") -> GGUFHeader:
    """Refuse a GGUF ragpic cannot convert, before any tensor is read.

    Args:
        option: how the caller names the argument in messages (``"model"``, ``"--model"``).

    Raises:
        UnsupportedModelError: its architecture is not one of :data:`GGUF_ARCHITECTURES`.
        ModelFileError: missing, not GGUF, or shorter than its header says (truncated).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelFileError(f"{option}={str(path)!r}: no such file; pass an existing .gguf file")
    header = read_header(path)
    if header.architecture not in GGUF_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{option}={str(path)!r}: GGUF architecture {header.architecture!r} is not supported; ragpic "
            f"converts {', '.join(GGUF_ARCHITECTURES)} GGUF files (pass a Hugging Face folder otherwise)")
    size = path.stat().st_size
    if size < header.data_end:
        raise ModelFileError(f"{option}={str(path)!r}: the file is truncated: {size:,} bytes, its header needs "
                             f"{header.data_end:,}; download or assemble it again")
    return header


def file_sha256(path: str | os.PathLike, *, label: str | None = None) -> str:
    """Hex SHA-256 of a file, read in 8 MiB blocks (a progress bar on stderr for large files)."""
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256()
    bar = None
    if size >= _SHOW_PROGRESS_FROM:
        from tqdm import tqdm

        bar = tqdm(total=size, unit="B", unit_scale=True, desc=f"sha256 {label or path.name}", file=sys.stderr)
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
            if bar is not None:
                bar.update(len(block))
    if bar is not None:
        bar.close()
    return digest.hexdigest()


def known_sha256(path: Path) -> str:
    """The file's SHA-256, remembered under the cache by (path, size, mtime) so a 1 GB file is
    hashed once per change, not once per load."""
    st = path.stat()
    stamp = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:32]
    memo = cache_dir() / "models" / "gguf" / "sha256" / stamp
    try:
        known = memo.read_text().strip()
        if len(known) == 64:
            return known
    except OSError:
        pass
    digest = file_sha256(path)
    memo.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo.with_name(f".{stamp}.{os.getpid()}")
    tmp.write_text(digest)
    os.replace(tmp, memo)
    return digest


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def gguf_model_dir(path: str | os.PathLike, dtype, *, option: str = "model") -> Path:
    """The cached HF folder of a GGUF file in ``dtype``, converting it on first use.

    Args:
        path: a ``.gguf`` file.
        dtype: ``torch.dtype`` the weights are dequantized to (``torch.float32``...).
        option: how messages name the argument.
    """
    path = Path(path).expanduser()
    header = check_gguf(path, option)
    digest = known_sha256(path)
    target = cache_dir() / "models" / "gguf" / f"{path.stem}-{digest[:16]}-{_dtype_name(dtype)}"
    if (target / "config.json").exists():
        return target
    print(f"ragpic: dequantizing {path.name} ({header.architecture}, {header.tensor_count} tensors) to "
          f"{_dtype_name(dtype)} once; cached in {target}", file=sys.stderr)
    return convert_gguf(path, target, dtype)


def convert_gguf(path: str | os.PathLike, target: Path, dtype) -> Path:
    """Dequantize ``path`` with transformers' GGUF reader and save it as an HF folder at ``target``.

    The folder appears atomically (written beside it, then renamed): a crash never leaves a
    half-written model, and of two processes converting at once the second's copy is dropped.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    refusal = (f"{path}: transformers' GGUF reader could not place every weight (the config it derives from "
               "the header does not fit the tensors, e.g. a qwen3 file whose head_dim is not 128); the model "
               "would be partly random, so it is refused: convert it to a Hugging Face folder instead")
    try:
        model, info = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                                           output_loading_info=True)
    except RuntimeError as e:  # transformers' own refusal of a tensor whose shape differs
        if "mismatch" not in str(e):
            raise
        raise UnsupportedModelError(refusal) from e
    if info.get("missing_keys") or info.get("mismatched_keys"):  # would be randomly initialized
        raise UnsupportedModelError(f"{refusal} (unplaced: {sorted(map(str, info.get('missing_keys') or ()))[:3]})")
    # The dequantized weights are plain tensors now; drop the GGUF marker so they can be saved.
    del model.config.quantization_config
    model.hf_quantizer = None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "config.json").exists():  # not another process winning the race
            raise
    return target
