"""The header of a GGUF file (v2/v3): metadata and tensor table, read without the tensor data.

Enough to refuse a file before dequantizing it (:mod:`ragpic.core.gguf`): its
``general.architecture``, and how many bytes its tensors need, which a truncated file lacks.
Stdlib only but for the GGML type-size table of the ``gguf`` package (numpy, no torch), so the
command line can check ``--model x.gguf`` in well under a second.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from ragpic.errors import ModelFileError

__all__ = ["GGUFHeader", "TensorInfo", "read_header", "read_metadata"]

_MAGIC = b"GGUF"
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    """What the header of a GGUF file says (no tensor data is read).

    Attributes:
        architecture: ``general.architecture`` (``"qwen2"``, ``"llama"``...).
        name: ``general.name`` or None.
        tensor_count: tensors the file declares.
        tensors: the tensor table, in the file's order.
        data_end: bytes the file must hold: the tensor data section's start plus the end of
            its furthest tensor. A shorter file was cut short.
    """

    architecture: str
    name: str | None
    tensor_count: int
    data_end: int
    tensors: tuple[TensorInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One entry of the tensor table: ``dims`` in GGUF's order (the contiguous one first),
    ``offset`` from the start of the file."""

    name: str
    ggml_type: int
    dims: tuple[int, ...]
    offset: int


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


def _read(path: str | os.PathLike, parse):
    path = Path(path)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < 24 or f.read(4) != _MAGIC:
            raise ModelFileError(f"{path}: not a GGUF file (no 'GGUF' magic at the start)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                return parse(_Cursor(buf), path)
            except struct.error as e:
                raise ModelFileError(f"{path}: the GGUF header is cut short or damaged ({e}); the file is "
                                     "truncated: download or assemble it again") from None


def read_header(path: str | os.PathLike) -> GGUFHeader:
    """Parse the metadata and tensor table of a GGUF file (v2/v3), without reading tensor data.

    Raises:
        ModelFileError: not a GGUF file, or the header itself is cut short.
    """
    return _read(path, _parse)


def read_metadata(path: str | os.PathLike) -> dict:
    """A GGUF file's metadata (``general.architecture``, ``qwen2.block_count``...), read from its
    header alone (no tensor table, no data; stdlib only). Raises like :func:`read_header`."""
    return _read(path, lambda cur, p: _metadata(cur, p)[1])


def _metadata(cur: _Cursor, path: Path) -> tuple[int, dict]:
    cur.pos = 4
    version = cur.take("<I")
    if version < 2:
        raise ModelFileError(f"{path}: GGUF version {version} is too old to read; convert it again with llama.cpp")
    tensor_count, kv_count = cur.take("<Q"), cur.take("<Q")
    meta = {}
    for _ in range(kv_count):
        key, vtype = cur.string(), cur.take("<I")
        meta[key] = cur.value(vtype)
    return tensor_count, meta


def _parse(cur: _Cursor, path: Path) -> GGUFHeader:
    tensor_count, meta = _metadata(cur, path)
    end, table = 0, []
    for _ in range(tensor_count):
        name = cur.string()
        dims = [cur.take("<Q") for _ in range(cur.take("<I"))]
        ggml_type, offset = cur.take("<I"), cur.take("<Q")
        end = max(end, offset + _tensor_bytes(ggml_type, dims, name, path))
        table.append((name, ggml_type, tuple(dims), offset))
    align = int(meta.get("general.alignment") or 32)
    data_start = -(-cur.pos // align) * align
    return GGUFHeader(architecture=str(meta.get("general.architecture") or ""), name=meta.get("general.name"),
                      tensor_count=tensor_count, data_end=data_start + end,
                      tensors=tuple(TensorInfo(n, t, d, data_start + o) for n, t, d, o in table))
