"""The one settings object a user touches."""

from __future__ import annotations

from dataclasses import dataclass

from .llm.linker import parse_method


@dataclass(slots=True)
class Config:
    """ragpic settings, checked on creation.

    Attributes:
        model: HF folder / cached hub id, or ``None`` for the embedded SmolLM2-135M-Instruct.
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda:1"``...
        dtype: ``"float32"``, ``"bfloat16"``, ``"float16"`` or ``None`` (fp32 on CPU, bf16 on GPU).
        method: link method: ``legolink-<k>`` (default ``legolink-16``), ``legolink-0``,
            ``naive``, ``cacheblend-<percent>`` or ``full``.
        store: where compiled KV lives: a folder (diskcache, put it beside your vector index),
            ``redis://host:port/db`` (shared by several workers), or ``None`` (memory only).
        store_size_limit_gb: disk budget of a folder store (LRU eviction past it).
        memory_cache_mb: hot in-memory tier in front of the store.
        kv_quant: ``"none"`` or ``"int8"`` (per-token absmax, half the bytes of fp16).
        compile_on_miss: compile chunks found in a prompt but not in the store (and store them);
            when ``False`` they are simply computed as text.
        max_new_tokens, temperature, top_p: decoding defaults.
        system_prompt: system message put before user prompts (``None``: the template's own).
        batch_tokens: padded tokens per compile forward (ingest throughput vs memory).
    """

    model: str | None = None
    device: str = "auto"
    dtype: str | None = None
    method: str = "legolink-16"
    store: str | None = None
    store_size_limit_gb: float = 8.0
    memory_cache_mb: int = 512
    kv_quant: str = "none"
    compile_on_miss: bool = True
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    system_prompt: str | None = None
    batch_tokens: int = 4096

    def __post_init__(self) -> None:
        parse_method(self.method)  # raises with the list of valid methods
        if self.kv_quant not in ("none", "int8"):
            raise ValueError(f"kv_quant must be 'none' or 'int8', got {self.kv_quant!r}")
        if self.dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16, float16 or None, got {self.dtype!r}")
        if self.max_new_tokens < 1 or self.batch_tokens < 1 or self.memory_cache_mb < 0:
            raise ValueError("max_new_tokens and batch_tokens must be >= 1, memory_cache_mb >= 0")
        if self.store_size_limit_gb <= 0:
            raise ValueError("store_size_limit_gb must be > 0")
