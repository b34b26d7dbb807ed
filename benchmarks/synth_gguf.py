"""A GGUF file of random weights in a real model's geometry and Q4_K_M type mix, to measure speed and memory.

Speed and memory do not depend on the weights' values, so a 7B-class model can be measured where
no 7B GGUF can be downloaded. The quantized blocks are written straight from random bytes (the
F16/F32 model never exists): codes uniform, fp16 scales set to small finite values so the
dequantized weights have a std of about 0.02. Norms are 1, biases about 0. The tokenizer
(every ``tokenizer.*`` key) is copied from the pinned Qwen2.5-Coder-0.5B GGUF.

    python benchmarks/synth_gguf.py --preset qwen2.5-7b [--out PATH] [--force] [--seed 0] \\
        [--tokenizer-from ~/.cache/ragpic/models/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf]

The file goes to ``cache_dir()/synth/<preset>-q4_k_m-random.gguf`` (``$RAGPIC_HOME`` or
``~/.cache/ragpic``) unless ``--out`` says otherwise, and is not written again if it exists
(``--force`` does). Type mix, as llama.cpp's Q4_K_M gives the real Qwen2.5 files: every matrix
Q4_K, ``output.weight`` Q6_K (the ``tiny`` preset ties it to the embedding), and ``attn_v`` /
``ffn_down`` Q6_K in half the layers (llama.cpp's ``use_more_bits`` over the layers in
name-sorted order: 0,1,5-10,13,16,19,21,24,27 of 28, as in the real 1.5B file); norms and
biases F32.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

PRESETS = {
    "qwen2.5-7b": dict(layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128, ffn=18944, tied=False),
    # tied (no output.weight, as Qwen2.5-0.5B): ~28 MB, of which 21 MB is the 151936-row embedding
    "tiny": dict(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=512, tied=True),
}
ARCH, ROPE_THETA, RMS_EPS, CONTEXT = "qwen2", 1e6, 1e-6, 32768
QK_K = 256
STD = 0.02  # the dequantized weights' target std
Q4_K_D, Q4_K_DMIN = STD / 258.3, 7.5 * STD / 258.3  # w = d sc q - dmin m, sc, m ~ U{0..63}, q ~ U{0..15}
Q6_K_D = STD / 341.5  # w = d sc (q - 32), sc ~ U{-32..31}, q ~ U{0..63}
CHUNK = 32 << 20  # bytes of random blocks generated at a time


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the layers that get more bits (Q6_K) under Q4_K_M."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def plan(preset: str, vocab: int) -> list[tuple[str, tuple[int, ...], str]]:
    """Every tensor as ``(name, numpy shape (rows, cols), GGML type name)``, in file order."""
    g = PRESETS[preset]
    h, n, q, kv = g["hidden"], g["layers"], g["heads"] * g["head_dim"], g["kv_heads"] * g["head_dim"]
    order = sorted(range(n), key=str)  # the real files count layers in name order: 0, 1, 10, 11...
    more = {layer for k, layer in enumerate(order) if use_more_bits(k, n)}
    out = [("token_embd.weight", (vocab, h), "Q4_K"), ("output_norm.weight", (h,), "F32")]
    out += [] if g["tied"] else [("output.weight", (vocab, h), "Q6_K")]
    for i in range(n):
        big = "Q6_K" if i in more else "Q4_K"
        out += [(f"blk.{i}.attn_norm.weight", (h,), "F32"),
                (f"blk.{i}.attn_q.weight", (q, h), "Q4_K"), (f"blk.{i}.attn_q.bias", (q,), "F32"),
                (f"blk.{i}.attn_k.weight", (kv, h), "Q4_K"), (f"blk.{i}.attn_k.bias", (kv,), "F32"),
                (f"blk.{i}.attn_v.weight", (kv, h), big), (f"blk.{i}.attn_v.bias", (kv,), "F32"),
                (f"blk.{i}.attn_output.weight", (h, q), "Q4_K"), (f"blk.{i}.ffn_norm.weight", (h,), "F32"),
                (f"blk.{i}.ffn_gate.weight", (g["ffn"], h), "Q4_K"), (f"blk.{i}.ffn_up.weight", (g["ffn"], h), "Q4_K"),
                (f"blk.{i}.ffn_down.weight", (h, g["ffn"]), big)]
    return out


def nbytes(shape: tuple[int, ...], qtype: str) -> int:
    """Bytes of a tensor of ``shape`` stored as ``qtype``."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    assert shape[-1] % block == 0, (shape, qtype)
    return int(np.prod(shape[:-1], dtype=np.int64)) * shape[-1] // block * size


def random_blocks(rng: np.random.Generator, n_blocks: int, qtype: str) -> np.ndarray:
    """``n_blocks`` raw blocks of ``qtype``: random codes, small finite fp16 super-block scales."""
    if qtype == "Q4_K":  # d f16, dmin f16, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
        raw = rng.integers(0, 256, (n_blocks, 144), dtype=np.uint8)
        jitter = rng.uniform(0.5, 1.5, (n_blocks, 1))
        raw[:, 0:4] = (jitter * [Q4_K_D, Q4_K_DMIN]).astype("<f2").view(np.uint8)
    elif qtype == "Q6_K":  # 128 bytes ql, 64 bytes qh, 16 int8 scales, d f16
        raw = rng.integers(0, 256, (n_blocks, 210), dtype=np.uint8)
        raw[:, 192:208] = rng.integers(-32, 32, (n_blocks, 16), dtype=np.int8).view(np.uint8)
        raw[:, 208:210] = (rng.uniform(0.5, 1.5, (n_blocks, 1)) * Q6_K_D).astype("<f2").view(np.uint8)
    else:
        raise ValueError(qtype)
    return raw


def tokenizer_fields(path: Path) -> list[tuple[str, object, object, object]]:
    """``(key, value, type, sub_type)`` of every ``tokenizer.*`` key of the GGUF at ``path``."""
    from gguf import GGUFReader, GGUFValueType

    out = []
    for key, field in GGUFReader(str(path)).fields.items():
        if key.startswith("tokenizer."):
            vtype = GGUFValueType(field.types[0])
            sub = GGUFValueType(field.types[-1]) if vtype == GGUFValueType.ARRAY else None
            out.append((key, field.contents(), vtype, sub))
    return out


def default_tokenizer() -> Path:
    from ragpic.models import MODELS, gguf_path

    return gguf_path(MODELS["qwen2.5-coder-0.5b"])


def default_out(preset: str) -> Path:
    from ragpic.paths import cache_dir

    return cache_dir() / "synth" / f"{preset}-q4_k_m-random.gguf"


def write_synth(preset: str, out: Path, tokenizer_from: Path, *, seed: int = 0) -> int:
    """Write the random GGUF of ``preset`` to ``out`` (via ``out.part``, renamed at the end); its size."""
    import gguf

    g = PRESETS[preset]
    fields = tokenizer_fields(tokenizer_from)
    vocab = len(next(v for k, v, _, _ in fields if k == "tokenizer.ggml.tokens"))
    tensors = plan(preset, vocab)
    part = out.with_name(out.name + ".part")
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(part), ARCH)
    w.add_name(f"synthetic {preset} (random weights, Q4_K_M mix)")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(g["hidden"])
    w.add_block_count(g["layers"])
    w.add_feed_forward_length(g["ffn"])
    w.add_head_count(g["heads"])
    w.add_head_count_kv(g["kv_heads"])
    if g["head_dim"] != g["hidden"] // g["heads"]:
        w.add_key_length(g["head_dim"])
        w.add_value_length(g["head_dim"])
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value, vtype, sub in fields:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, shape, qtype in tensors:
        if qtype == "F32":
            w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes(shape, qtype))
        else:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
            w.add_tensor_info(name, (shape[0], shape[1] // block * size), np.dtype(np.uint8), nbytes(shape, qtype),
                              raw_dtype=gguf.GGMLQuantizationType[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    # the tensor data, written here a piece at a time (GGUFWriter.write_tensor_data wants each whole):
    # aligned like write_tensor_data, in add_tensor_info's order, which write_ti_data_to_file's offsets follow
    fout = w.fout[0]
    rng = np.random.default_rng(seed)
    written, total = 0, sum(nbytes(s, q) for _, s, q in tensors)
    for i, (name, shape, qtype) in enumerate(tensors, 1):
        w.write_padding(fout, fout.tell())
        if qtype == "F32":
            if name.endswith(".bias"):
                data = (rng.standard_normal(shape) * STD).astype("<f4")
            else:
                data = np.ones(shape, "<f4")
            data.tofile(fout)
        else:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
            n_blocks = shape[0] * shape[1] // block
            step = max(1, CHUNK // size)
            for start in range(0, n_blocks, step):
                random_blocks(rng, min(step, n_blocks - start), qtype).tofile(fout)
        w.write_padding(fout, nbytes(shape, qtype))
        written += nbytes(shape, qtype)
        print(f"[{i}/{len(tensors)}] {name} {qtype} {list(shape)}: {written / 2**20:,.1f} of {total / 2**20:,.1f} MiB",
              flush=True)
    w.close()
    os.replace(part, out)
    return out.stat().st_size


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="qwen2.5-7b")
    p.add_argument("--out", type=Path, default=None, help="default: cache_dir()/synth/<preset>-q4_k_m-random.gguf")
    p.add_argument("--force", action="store_true", help="write the file even when it exists")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer-from", type=Path, default=None,
                   help="a GGUF whose tokenizer.* keys to copy (default: the pinned qwen2.5-coder-0.5b)")
    args = p.parse_args(argv)
    out = (args.out or default_out(args.preset)).expanduser()
    if out.is_file() and not args.force:
        print(f"{out} exists ({out.stat().st_size:,} bytes); not written again (--force does)")
        return 0
    tok = (args.tokenizer_from or default_tokenizer()).expanduser()
    if not tok.is_file():
        print(f"no tokenizer source at {tok}: run `ragpic model get qwen2.5-coder-0.5b` or pass --tokenizer-from",
              file=sys.stderr)
        return 2
    size = write_synth(args.preset, out, tok, seed=args.seed)
    print(f"wrote {out}: {size:,} bytes ({size / 2**30:.2f} GiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
