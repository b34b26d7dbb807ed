"""Any GGUF file as a model: read its header, refuse what cannot load, dequantize once, cache.

``Config(model="x.gguf")`` lands here (docs/ARCHITECTURE.md §2). The header is read
first, in well under a second, so an architecture ragpic cannot link or a file cut short is
refused before gigabytes are dequantized. A file that passes is dequantized by transformers'
GGUF reader to the requested dtype once and saved as a Hugging Face folder (safetensors,
config, tokenizer) under ``cache_dir()/models/gguf/``, keyed by the file's SHA-256 and the
dtype: a renamed or moved copy of the same file reuses the folder, an edited file does not.

Only the header parser and the hash run at import-free speed; torch and transformers are
imported when a conversion actually runs.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import shutil
import struct
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ragpic.config import cache_dir
from ragpic.errors import ModelFileError, UnsupportedModelError

__all__ = ["GGUF_ARCHITECTURES", "GGUFHeader", "check_gguf", "convert_gguf", "file_sha256", "gguf_model_dir",
           "is_gguf_path", "read_header"]

# GGUF ``general.architecture`` values ragpic converts: transformers' GGUF reader reads them AND
# ragpic links them exactly (core.model.SUPPORTED_MODEL_TYPES). Gemma is linkable but
# transformers reads only gemma2/gemma3 GGUF files, which ragpic does not link.
GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
_MAGIC = b"GGUF"
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_HASH_BLOCK = 8 << 20
_SHOW_PROGRESS_FROM = 256 << 20  # hashing a file smaller than this takes under a second


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    """What the header of a GGUF file says (no tensor data is read).

    Attributes:
        architecture: ``general.architecture`` (``"qwen2"``, ``"llama"``...).
        name: ``general.name`` or None.
        tensor_count: tensors the file declares.
        data_end: bytes the file must hold: the tensor data section's start plus the end of
            its furthest tensor. A shorter file was cut short.
    """

    architecture: str
    name: str | None
    tensor_count: int
    data_end: int


def is_gguf_path(value: str | os.PathLike | None) -> bool:
    """True when ``value`` names a ``.gguf`` file (by its suffix; existence is checked later)."""
    return value is not None and str(value).lower().endswith(".gguf")


class _Cursor:
    """Reads little-endian GGUF values from a buffer; ``struct.error`` when the buffer ends."""

    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt: str):
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise struct.error("string runs past the end of the file")
        text = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", "replace")
        self.pos += n
        return text

    def value(self, vtype: int):
        """One metadata value; arrays are skipped (None): the header facts we need are scalars."""
        if vtype == _STRING:
            return self.string()
        if vtype in _SCALAR:
            return self.take(_SCALAR[vtype])
        if vtype != _ARRAY:
            raise struct.error(f"unknown metadata type {vtype}")
        item, count = self.take("<I"), self.take("<Q")
        if item in _SCALAR:
            self.pos += count * struct.calcsize(_SCALAR[item])
        else:
            for _ in range(count):
                self.value(item)
        if self.pos > len(self.buf):
            raise struct.error("array runs past the end of the file")
        return None


def _tensor_bytes(ggml_type: int, dims: list[int], name: str, path: Path) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # numpy-only import

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise ModelFileError(f"{path}: tensor {name!r} has GGML type {ggml_type}, which the installed gguf "
                             "package cannot read; upgrade it (`pip install -U gguf`)") from None
    elements = 1
    for d in dims:
        elements *= d
    return elements // block * size


def read_header(path: str | os.PathLike) -> GGUFHeader:
    """Parse the metadata and tensor table of a GGUF file (v2/v3), without reading tensor data.

    Raises:
        ModelFileError: not a GGUF file, or the header itself is cut short.
    """
    path = Path(path)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < 24 or f.read(4) != _MAGIC:
            raise ModelFileError(f"{path}: not a GGUF file (no 'GGUF' magic at the start)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                return _parse(_Cursor(buf), path)
            except struct.error as e:
                raise ModelFileError(f"{path}: the GGUF header is cut short or damaged ({e}); the file is "
                                     "truncated: download or assemble it again") from None


def _parse(cur: _Cursor, path: Path) -> GGUFHeader:
    cur.pos = 4
    version = cur.take("<I")
    if version < 2:
        raise ModelFileError(f"{path}: GGUF version {version} is too old to read; convert it again with llama.cpp")
    tensor_count, kv_count = cur.take("<Q"), cur.take("<Q")
    meta = {}
    for _ in range(kv_count):
        key, vtype = cur.string(), cur.take("<I")
        meta[key] = cur.value(vtype)
    end = 0
    for _ in range(tensor_count):
        name = cur.string()
        dims = [cur.take("<Q") for _ in range(cur.take("<I"))]
        ggml_type, offset = cur.take("<I"), cur.take("<Q")
        end = max(end, offset + _tensor_bytes(ggml_type, dims, name, path))
    align = int(meta.get("general.alignment") or 32)
    data_start = -(-cur.pos // align) * align
    return GGUFHeader(architecture=str(meta.get("general.architecture") or ""), name=meta.get("general.name"),
                      tensor_count=tensor_count, data_end=data_start + end)


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


def _known_sha256(path: Path) -> str:
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
    digest = _known_sha256(path)
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
