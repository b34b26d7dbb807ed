"""Helpers shared by the device-path tests (CPU) and the CUDA checks (tests/core/test_cuda.py).

- :func:`transposed_layout_sdpa`: SDPA whose output has the memory layout of CUDA's
  memory-efficient kernel (a transposed output), to reproduce layout bugs on the CPU;
- :func:`reference_attention`: textbook attention in float64;
- :func:`host_reads`: every host read of a tensor (``item``, ``tolist``, ``bool``...) made
  while a block runs, by the ragpic function that made it;
- :func:`compare_to_reference`: every method plus greedy decode on one model against a
  reference model (fp32), with a bf16 tolerance plus top-1 agreement (docs/RESULTS.md §7).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import traceback

import torch

from prompts import compile_texts, linked_prompt
from ragpic.core.decode import Sampling, decode_tokens
from ragpic.core.runner import forward_rows
from ragpic.core.link import link
from ragpic.core.model import wrap_model

METHODS = ("full", "naive", "legolink-2", "legolink-1000", "cacheblend-30", "legolink-0")
# bf16 has an 8-bit mantissa: one rounding is 2**-9 relative, and a forward compounds a few
# hundred of them. Logits must agree to this fraction of their largest magnitude, and agree on top-1.
BF16_RTOL = 0.1  # measured: <= 0.045 on the tiny models (3 layers, weights x8), every method
DECODE_AGREEMENT = 0.75  # teacher-forced top-1 agreement with the reference's greedy tokens

HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")


def transposed_layout_sdpa(real):
    """Wrap SDPA so its ``(B, H, R, D)`` output is stored as ``(B, R, H, D)`` (not contiguous)."""
    def sdpa(*args, **kwargs):
        return real(*args, **kwargs).transpose(1, 2).contiguous().transpose(1, 2)
    return sdpa


def reference_attention(q, k, v, mask, scale):
    """float64 attention with K/V repeated per head: softmax(q k^T * scale + mask) v."""
    g = q.shape[1] // k.shape[1]
    k, v = (x.double().repeat_interleave(g, dim=1) for x in (k, v))
    scores = q.double() @ k.transpose(-1, -2) * scale
    if mask is not None:
        scores = scores + mask.double()
    return scores.softmax(-1) @ v


@contextlib.contextmanager
def host_reads():
    """Yields a Counter of ``"file.py:function"`` -> host reads of tensors made inside ragpic
    (the innermost ragpic frame; reads from other libraries count under ``"other"``)."""
    counts: collections.Counter = collections.Counter()
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counting(name):
        def read(self, *args, **kwargs):
            frames = [f for f in traceback.extract_stack()[:-1] if "/ragpic/" in f.filename]
            site = f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].name}" if frames else "other"
            counts[site] += 1
            return originals[name](self, *args, **kwargs)
        return read

    for name in HOST_READS:
        setattr(torch.Tensor, name, counting(name))
    try:
        yield counts
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


def converted(lm, device, dtype, **wrap):
    """The same weights as ``lm`` on ``device`` in ``dtype``, wrapped anew (its own fingerprint)."""
    model = copy.deepcopy(lm.model).to(device=device, dtype=dtype)
    banded = wrap.pop("banded_attention", lm.banded_attention)
    if banded:
        model.set_attn_implementation("sdpa")
    return wrap_model(model, lm.tokenizer, name=f"{lm.name}-{dtype}", banded_attention=banded, **wrap)


def method_prompts(lm) -> dict[str, list]:
    """The shared prompt per compile recipe (``plain`` and ``bos4``), compiled by ``lm``."""
    return {recipe: linked_prompt(lm, compile_texts(lm, recipe=recipe)) for recipe in ("plain", "bos4")}


def _prompt_for(prompts, method):
    return prompts["bos4" if method == "legolink-0" else "plain"]


@torch.inference_mode()
def _teacher_forced(lm, res, tokens):
    """``(A,)`` argmax of ``lm`` after each of ``tokens`` fed over ``res.cache`` (host positions)."""
    n, a = res.num_tokens, len(tokens)
    host = torch.arange(n, n + a)
    ids = torch.tensor(tokens, dtype=torch.long).to(lm.device)
    logits = forward_rows(lm, res.cache, ids, host.to(lm.device), n + a, logits_to_keep=0, host_positions=host)
    return logits.float().argmax(-1).cpu()


def compare_to_reference(lm, ref, methods=METHODS, new_tokens: int = 8) -> list[dict]:
    """Link every method on ``lm`` and on ``ref``; decode ``new_tokens`` greedily on both.

    Returns one row per method: ``max_abs`` and ``rel`` (of the first logits, relative to the
    reference's largest), ``top1`` (same first token), ``decode_agree`` (``lm``'s top-1 after
    each of the reference's tokens, teacher-forced over ``lm``'s own cache), ``finite``.
    """
    prompts, ref_prompts = method_prompts(lm), method_prompts(ref)
    rows = []
    for m in methods:
        sampling = Sampling(max_new_tokens=new_tokens)
        want = link(ref, _prompt_for(ref_prompts, m), m, extra_capacity=new_tokens)
        ref_tokens = list(decode_tokens(ref, want.cache, want.logits, want.num_tokens, sampling))
        got = link(lm, _prompt_for(prompts, m), m, extra_capacity=2 * new_tokens)
        tokens = list(decode_tokens(lm, got.cache, got.logits, got.num_tokens, sampling))
        a, b = got.logits.float().cpu(), want.logits.float().cpu()
        agree = 1.0
        if ref_tokens[:-1]:
            forced = _teacher_forced(lm, got, ref_tokens[:-1])
            agree = float((forced == torch.tensor(ref_tokens[1:])).float().mean())
        rows.append({"method": m, "max_abs": float((a - b).abs().max()),
                     "rel": float((a - b).abs().max() / b.abs().max()), "top1": int(a.argmax()) == int(b.argmax()),
                     "decode_agree": agree, "finite": bool(torch.isfinite(a).all()), "tokens": len(tokens)})
    return rows


def bf16_ok(row: dict) -> bool:
    return row["finite"] and row["rel"] <= BF16_RTOL and row["top1"] and row["decode_agree"] >= DECODE_AGREEMENT


def report(**row) -> None:
    """Append one JSON row to ``$RAGPIC_GPU_REPORT`` (scripts/gpu_check.sh's summary) if set."""
    import json
    import os

    path = os.environ.get("RAGPIC_GPU_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row, default=str) + "\n")
