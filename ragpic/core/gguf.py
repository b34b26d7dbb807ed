"""Any GGUF file as a model: read its header, refuse what cannot load, convert once, cache.

``Config(model="x.gguf")`` lands here (docs/ARCHITECTURE.md §2). The header is read
first, in well under a second, so an architecture ragpic cannot link or a file cut short is
refused before a tensor is read. A file that passes is converted once, a tensor at a time
(:mod:`ragpic.core.weights.from_gguf`: the whole model never exists dense, so the first load
stays within about the file's own size), into a folder under ``cache_dir()/models/gguf/``
keyed by the file's SHA-256, the weights format and the dtype: a renamed or moved copy of the
same file reuses the folder, an edited file does not.

The header parser lives in :mod:`ragpic.core.gguf_header`; torch and transformers are
imported only when a conversion actually runs.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from ragpic.paths import cache_dir
from ragpic.core.gguf_header import GGUFHeader, read_header
from ragpic.errors import ModelFileError, UnsupportedModelError

__all__ = ["GGUF_ARCHITECTURES", "GGUFHeader", "check_gguf", "convert_gguf", "file_sha256", "folder_name", "gguf_config",
           "gguf_folder", "is_gguf_path", "known_sha256", "read_header"]

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


def folder_name(stem: str, digest: str, fmt, dtype) -> str:
    """The cache folder's name of a GGUF converted to ``fmt`` in ``dtype``: by content and format,
    and for int4 layers by this CPU's packing (packed bytes of an AVX-512 machine are wrong on an
    AVX2 one: :func:`ragpic.core.weights.linear.pack_block`)."""
    from ragpic.core.weights import WeightFormat

    name = f"{stem}-{digest[:16]}-{_dtype_name(dtype)}"
    if fmt is WeightFormat.DENSE:
        return name
    # v3 where the layout changed: a quantized fp32 model's scales are kept in bf16 (kernel_dtype)
    version = "v2" if _dtype_name(dtype) == "bfloat16" else "v3"
    if fmt is WeightFormat.INT8:
        return f"{name}-{fmt.value}-{version}"
    from ragpic.core.weights.linear import pack_block

    return f"{name}-{fmt.value}-b{pack_block()}-{version}"


def gguf_config(path: str | os.PathLike):
    """The transformers config of a GGUF file, from its header alone (no tensor is read)."""
    from transformers import AutoConfig

    path = Path(path).expanduser()
    return AutoConfig.from_pretrained(path.parent, gguf_file=path.name)


def gguf_folder(path: str | os.PathLike, fmt, dtype, *, option: str = "model") -> Path:
    """The cached folder of a GGUF file in weights format ``fmt`` and ``dtype``, converted on first use.

    Args:
        path: a ``.gguf`` file.
        fmt: a :class:`~ragpic.core.weights.WeightFormat` other than ``auto``: ``dense`` gives a
            Hugging Face folder, a quantized format ragpic's saved model
            (:mod:`ragpic.core.weights.saved`).
        dtype: the ``torch.dtype`` the model computes in.
        option: how messages name the argument.

    Raises:
        UnsupportedModelError: the architecture or its RoPE cannot be linked, or a tensor does not fit.
        ModelFileError: missing, not GGUF, or cut short.
    """
    from ragpic.core.supported import check_supported

    path = Path(path).expanduser()
    header = check_gguf(path, option)
    target = cache_dir() / "models" / "gguf" / folder_name(path.stem, known_sha256(path), fmt, dtype)
    if (target / "config.json").is_file():  # written last inside the folder, which is renamed into place whole
        return target
    config = gguf_config(path)
    check_supported(config)  # refuse before a tensor is read
    print(f"ragpic: converting {path.name} ({header.architecture}, {header.tensor_count} tensors) to weights={fmt.value} "
          f"in {_dtype_name(dtype)} once, a tensor at a time; cached in {target}", file=sys.stderr)
    return convert_gguf(path, target, dtype, fmt=fmt, config=config)


def convert_gguf(path: str | os.PathLike, target: Path, dtype, *, fmt=None, config=None) -> Path:
    """Convert ``path`` to the folder ``target`` (:func:`ragpic.core.weights.from_gguf.write_converted`).

    Args:
        dtype: a ``torch.dtype`` or its name (``"float32"``).
        fmt: the weights format (default ``dense``: a Hugging Face folder).
        config: the file's config when the caller has read it already.

    The folder appears atomically (written beside it, then renamed): a crash never leaves a
    half-written model, and of two processes converting at once the second's copy is dropped.
    """
    import torch
    from transformers import AutoTokenizer

    from ragpic.core.weights import WeightFormat
    from ragpic.core.weights.from_gguf import write_converted

    path = Path(path)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    config = gguf_config(path) if config is None else config
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return write_converted(path, target, config, tokenizer, fmt or WeightFormat.DENSE, dtype)
