"""The one settings object a user touches, and where ragpic keeps files. No torch import."""

from __future__ import annotations

from dataclasses import dataclass

from ragpic.checks import check_int, check_number
from ragpic.core.kv_quant import KVQuant, parse_kv_quant
from ragpic.core.methods import Method, parse_method
from ragpic.core.weights import WeightFormat, parse_weights
from ragpic.errors import ConfigError
from ragpic.paths import cache_dir, kv_folder  # re-exported: ragpic.kv_folder, ragpic.config.cache_dir

__all__ = ["Config", "cache_dir", "kv_folder"]

DTYPES = (None, "auto", "float32", "bfloat16", "float16")


MAX_COMPILE_BEHIND = 16
"""Most chunks a chunk is compiled (and looked up) behind: each is one store key tried per chunk
of every prompt, and a context past the model's window cannot be compiled anyway."""


@dataclass(slots=True)
class Config:
    """ragpic settings, checked on creation (a bad one raises :class:`ragpic.errors.ConfigError`).

    Attributes:
        model: HF folder / cached hub id, a ``.gguf`` file (dequantized once to ``dtype`` and
            cached, :mod:`ragpic.core.gguf`), or ``None`` for the embedded SmolLM2-135M-Instruct.
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda:1"``...
        dtype: ``"float32"``, ``"bfloat16"``, ``"float16"``, ``None`` (fp32 on CPU, bf16 on GPU)
            or ``"auto"`` (also bf16 on a CPU with native bf16 instructions, AVX512_BF16/AMX).
        weights: how the weights are held: ``"auto"`` (the default: a ``.gguf`` model keeps
            its own 4-bit blocks, the rest re-quantized to int4, computing in bf16, on a CPU with native bf16;
            dense otherwise; docs/RESULTS.md §17), ``"dense"``, ``"int8"``, ``"int4"`` (weight-only,
            on torch's CPU kernels) or ``"gguf"``. Part of the store's fingerprint.
        hold_dense: under quantized weights, keep each layer's dequantized (dense) weight once
            made, so links and prefills skip the dequantization: ~1.2 s a pass on the 1.5B,
            for the dense weights' memory (~2 bytes a weight in bf16); decode still reads the
            quantized weights, and the fingerprint does not change (docs/RESULTS.md §24).
            Off by default, so an in-process model's memory stays near its file's (the 0.5B:
            1.6 GB peak, 2.3 GB held); ``"auto"`` (what ``ragpic serve`` runs, as a server owns its
            machine) holds them when they fit a quarter of the machine's memory (the 0.5B's
            0.9 GB, the 1.5B's 2.6 GB; not a 7B's 13 GB on 24 GB).
        method: how chunks are linked (docs: *Choosing a method*): ``"auto"`` (the default: the
            fastest preset that keeps ``fidelity`` of ``full``'s score on this model, from the
            calibration shipped for the models ragpic installs or your own ``ragpic calibrate``;
            without one, :data:`ragpic.engine.calibration.FALLBACK`, said once in the log), a
            preset (``"fast"``, ``"balanced"``, ``"faithful"``: :data:`ragpic.core.methods.PRESETS`),
            ``"full"`` (prefill everything: exactly the model's own answer), ``"naive"`` (the
            cached KV as it is, the question recomputed) or ``"legolink-<k>"`` (EPIC's LegoLink:
            each chunk's first ``k`` tokens recomputed; ``legolink-0`` compiles behind dummy
            tokens). Experimental recipes are written ``"experimental:<recipe>"``
            (:mod:`ragpic.core.methods`).
        fidelity: ``auto``'s target: the share of ``full``'s score, in (0, 1], a recipe must keep
            on every calibration task ``full`` can do.
        store: where compiled KV lives: a folder (put it beside your vector index, see
            :func:`kv_folder`), ``redis://host:port/db`` (shared by several workers),
            ``redis-cluster://host:port,host:port`` (a Redis Cluster), or
            ``None`` (memory only).
        store_size_limit_gb: disk budget of a folder store (LRU eviction past it).
        memory_cache_mb: hot in-memory tier in front of the store.
        store_stats_interval_s: at most this often, add this process's hits, misses and
            recompiles to the store's shared counters (``ragpic store stats``) and log them
            at INFO on the ``ragpic.cache`` logger; ``0``: only when the store is closed.
        kv_quant: how compiled KV is stored: ``"int8"`` (the default: per-token absmax, 0.26x
            the bytes of fp32, 0.52x of fp16; chosen by measurement, its fidelity to ``full``
            equals exact storage's on the eval and needle sets, docs/RESULTS.md §1),
            ``"none"`` (bit-exact) or ``"int4"`` (keys per channel, values per token: 0.14x
            of fp32, at a measurable +8% KL).
        compile_on_miss: compile chunks found in a prompt but not in the store (and store them);
            when ``False`` they are simply computed as text.
        prefix_cache_tokens: rows of leading prompt text (template, system prompt, the
            instruction before the context) whose KV the engine keeps from one link to the next
            that starts with the same tokens, in memory, least recently used out; ``0``: off.
            Exact (nothing precedes those tokens), so every method links the same bits it
            would compute (:mod:`ragpic.engine.prefix`; docs/RESULTS.md §25).
        max_new_tokens, temperature, top_p: decoding defaults.
        system_prompt: system message put before user prompts (``None``: the template's own).
        batch_tokens: padded tokens per compile forward (ingest throughput vs memory).
        min_chunk_tokens: texts shorter than this are never compiled, stored or matched in a
            prompt (a short cached text like "an" would match inside words; its KV saves
            nothing): they are computed as text.
        compile_behind: ``compile(texts, in_order=True)`` (one document's chunks, in order) also
            compiles each chunk behind the ``compile_behind`` chunks before it, and a prompt that
            holds a chunk right after those chunks links that entry instead of the chunk alone:
            its KV has read them (docs/ARCHITECTURE.md §1.3; the 0.5B keeps `full`'s RULER
            score at 4k with 4, docs/RESULTS.md §31). ``0``: off (no extra compile, no extra lookups).
        compile_head: with ``compile_behind``, what each of those entries reads first, as the
            prompt's own chunks do (docs/ARCHITECTURE.md §1.3): ``False`` (the default), nothing
            but the chunks before; ``True``, the chat opening every completion prompt of this
            engine starts with (the template's start and ``system_prompt``, up to the user's
            text); a string, that opening and then this text: what the application's prompts put
            before their first chunk inside the user turn (e.g. ``"Read the log.\n\n"``). The
            document's first chunk gets an entry behind it too. Such entries link only into
            prompts whose leading text starts with it: a framework whose prompts bring their own
            system message (LlamaIndex's default QA template does) needs that message as
            ``system_prompt`` (the hooks' ``qa_head()`` give both, for LlamaIndex and LangChain).
            On the 0.5B's RULER 4k, ``legolink-16`` on chunks behind four keeps 78% of ``full``
            with ``False``, 88% with ``True`` and 102% behind the whole leading text
            (docs/RESULTS.md §33).
    """

    model: str | None = None
    device: str = "auto"
    dtype: str | None = None
    weights: str | WeightFormat = "auto"
    hold_dense: bool | str = False
    method: str | Method = "auto"
    fidelity: float = 0.97
    store: str | None = None
    store_size_limit_gb: float = 8.0
    memory_cache_mb: int = 512
    store_stats_interval_s: float = 300.0
    kv_quant: str | KVQuant = "int8"
    compile_on_miss: bool = True
    prefix_cache_tokens: int = 8192
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    system_prompt: str | None = None
    batch_tokens: int = 4096
    min_chunk_tokens: int = 16
    compile_behind: int = 0
    compile_head: bool | str = False

    def __post_init__(self) -> None:
        parse_method(self.method)  # raises with the list of valid methods; kept as given (a name or a Method)
        self.kv_quant = parse_kv_quant(self.kv_quant)  # parsed here; a KVQuant below
        self.weights = parse_weights(self.weights)
        if self.hold_dense is not True and self.hold_dense is not False and self.hold_dense != "auto":
            raise ConfigError(f"hold_dense must be True, False or 'auto', got {self.hold_dense!r}")
        if not isinstance(self.compile_on_miss, bool):
            raise ConfigError(f"compile_on_miss must be True or False, got {self.compile_on_miss!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be float32, bfloat16, float16, auto or None, got {self.dtype!r}")
        for name in ("max_new_tokens", "batch_tokens", "min_chunk_tokens"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("memory_cache_mb", self.memory_cache_mb, minimum=0)
        check_int("prefix_cache_tokens", self.prefix_cache_tokens, minimum=0)
        check_int("compile_behind", self.compile_behind, minimum=0)
        if not isinstance(self.compile_head, (bool, str)) or self.compile_head == "":
            raise ConfigError(f"compile_head must be True (the chat opening), False (none) or the text your prompts "
                              f"put before their first chunk, got {self.compile_head!r}")
        if self.compile_behind > MAX_COMPILE_BEHIND:
            raise ConfigError(f"compile_behind must be at most {MAX_COMPILE_BEHIND}, got {self.compile_behind}: every "
                              f"chunk is looked up behind that many chunks in every prompt")
        check_number("store_size_limit_gb", self.store_size_limit_gb, "a number of GiB > 0", lambda v: v > 0)
        check_number("store_stats_interval_s", self.store_stats_interval_s, "a number of seconds >= 0 "
                     "(0: only on close)", lambda v: v >= 0)
        check_number("temperature", self.temperature, "a number >= 0 (0 is greedy)", lambda v: v >= 0)
        check_number("fidelity", self.fidelity, "a share of full's score in (0, 1], e.g. 0.97",
                     lambda v: 0 < v <= 1)
        check_number("top_p", self.top_p, "a number in (0, 1]", lambda v: 0 < v <= 1)

