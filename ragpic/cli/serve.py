"""``ragpic serve``: start the OpenAI-compatible server (wired into ``ragpic/cli/main.py``).

Every argument is checked before the model loads (one-line errors, exit 2). Defaults: the
embedded SmolLM2, ``auto``, a folder store under ``ragpic.paths.cache_dir()/serve/kv``,
127.0.0.1:8000. ``--store redis://host:port/db`` shares compiled KV (and the chunk index)
with every other replica on that Redis.
"""

from __future__ import annotations

import argparse
import logging
import os

from ragpic.cmdline import COMPILE_HEAD_HELP, DTYPE_HELP
from ragpic.core.weights import NAMES as WEIGHT_NAMES

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``serve`` to the ``ragpic`` parser."""
    from ragpic.cmdline import at_least, method_name
    from ragpic.config import MAX_COMPILE_BEHIND, Config

    p = subparsers.add_parser("serve", help="OpenAI-compatible server with EPIC's context-cache API",
                              description="Serve /v1/chat/completions, /v1/completions, /v1/models, "
                                          "/v1/context_cache, /health and /metrics over one model.")
    p.add_argument("--model", default=None, help="HF model folder or .gguf file (default: the embedded "
                                                       "SmolLM2-135M-Instruct)")
    p.add_argument("--model-id", default=None, help="name clients pass as model (default: the model's name)")
    p.add_argument("--store", default=None, help="KV store: a folder or redis://host:port/db "
                                                 "(default: <ragpic cache dir>/serve/kv)")
    p.add_argument("--method", type=method_name, default="auto",
                   help="link method (default auto: the fastest preset keeping full's score on this model's calibration; "
                        "fast, balanced, faithful, full, naive, legolink-<k>)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=at_least(0), default=8000, help="port (default 8000)")
    p.add_argument("--api-key", action="append", default=None,
                   help="require Authorization: Bearer KEY (default: $RAGPIC_API_KEY, else none); repeat it for "
                        "several keys, each its own namespace of context-cache ids (key1, key2...)")
    p.add_argument("--api-keys", default=None, metavar="FILE",
                   help="tenants: a file of 'NAMESPACE KEY' lines (each key once, at least 16 characters); "
                        "each namespace sees only its own context-cache ids")
    p.add_argument("--max-queue", type=at_least(0), default=64, help="requests waiting beyond the batch; "
                                                                     "more get HTTP 429 (default 64)")
    p.add_argument("--max-batch", type=at_least(1), default=8, help="requests decoded together (1: one at a time)")
    p.add_argument("--max-prompt-tokens", type=at_least(1), default=None,
                   help="longest prompt accepted (default: the model's context window)")
    p.add_argument("--link-piece", type=at_least(0), default=512,
                   help="most rows one piece forwards between two decode steps of the running requests: a "
                        "link's recomputed rows or a compile's (short chunks together, a long one in parts) "
                        "(0: links whole, compiles one chunk per piece; default 512)")
    p.add_argument("--max-kv-rows", type=at_least(0), default=0,
                   help="KV rows (prompt + max_tokens per request) the linking and decoding requests may hold "
                        "together; a request that does not fit waits, one larger than the budget gets HTTP 413 "
                        "(0: max-batch x the model's context window, so only --max-batch binds; default 0)")
    p.add_argument("--max-body-mb", type=at_least(1), default=4, help="largest request body (default 4 MiB)")
    p.add_argument("--max-compile-tokens", type=at_least(0), default=32768,
                   help="most tokens one POST /v1/context_cache compiles; more get HTTP 413 (0: no limit; "
                        "default 32768)")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a connection may take to send a request's headers (default 10)")
    p.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds a request body may go without a byte before a 408 (default 30)")
    p.add_argument("--shutdown-grace", type=float, default=30.0,
                   help="on SIGTERM/SIGINT: seconds running requests get to finish while new ones get 503; "
                        "what still runs then ends with an error (default 30)")
    p.add_argument("--docs", action="store_true",
                   help="serve /docs, /redoc and /openapi.json (behind --api-key when set; off by default)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda:0...")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default=None,
                   help=DTYPE_HELP)
    p.add_argument("--weights", choices=WEIGHT_NAMES, default="auto",
                   help="weight format (default auto: a .gguf keeps its own 4-bit blocks, the rest int4, in bf16, "
                        "on a CPU with native bf16; else dense); int8/int4: weight-only on torch's CPU kernels")
    p.add_argument("--hold-dense", action=argparse.BooleanOptionalAction, default="auto",
                   help="under quantized weights, keep each layer's dequantized weight once made, so links "
                        "skip the dequantization (~1.2 s a pass on a 1.5B); default (unlike Config()): when "
                        "the copies fit a quarter of this machine's memory, as a server owns its machine")
    p.add_argument("--compile-behind", type=at_least(0), default=0, metavar="M",
                   help="link a chunk's entry compiled behind the (up to M) chunks before it where a prompt holds "
                        "them in that order, as `ragpic compile --compile-behind M` or RagPic.compile(texts, "
                        f"in_order=True) stored them (at most {MAX_COMPILE_BEHIND}; default 0: off)")
    p.add_argument("--compile-head", default=None, metavar="TEXT",
                   help=COMPILE_HEAD_HELP)
    rows = Config.__dataclass_fields__["prefix_cache_tokens"].default
    p.add_argument("--prefix-cache-tokens", type=at_least(0), default=rows, metavar="N",
                   help="rows of leading prompt text (template, system prompt) whose exact KV is kept for the "
                        f"next request of the same namespace that starts with it (default {rows}; 0: off)")
    p.add_argument("--memory-cache-mb", type=at_least(0), default=512, metavar="MB",
                   help="decoded KV held in memory in front of the store (default 512; its bytes are the "
                        "ragpic_store_memory_bytes gauge)")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=run, check=check)
    return p


def check(args: argparse.Namespace) -> None:
    """Check what can be checked without loading anything (raises UsageError)."""
    from ragpic.cmdline import check_model, need_module
    from ragpic.config import Config
    from ragpic.errors import ConfigError, UsageError

    check_model(args.model)
    try:  # Config's own bound, before anything loads
        Config(compile_behind=args.compile_behind)
    except ConfigError as exc:
        raise UsageError(f"--compile-behind: {exc}") from None
    if args.compile_head is not None:
        try:
            Config(compile_head=args.compile_head)
        except ConfigError as exc:
            raise UsageError(f"--compile-head: {exc}") from None
    need_module("fastapi", "ragpic serve", "serve")
    need_module("uvicorn", "ragpic serve", "serve")
    if args.store:  # the store spec's own rule for its kind (ragpic/cache/backends/kinds.py)
        from ragpic.cache.backends.kinds import store_kind

        try:
            kind, _ = store_kind(args.store)
        except ValueError as e:
            raise UsageError(f"--store {args.store}: {e}") from None
        if kind.needs:
            need_module(kind.needs[0], f"--store {kind.name}", kind.needs[1])
    args.keys = api_keys(args)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.keys:
        logging.getLogger("ragpic.serve").warning("listening on %s without --api-key", args.host)
    if args.port > 65535:
        raise UsageError(f"--port {args.port}: must be at most 65535")
    for flag in ("header_timeout", "body_timeout", "shutdown_grace"):
        value = getattr(args, flag)
        if not (value >= 0 and value < float("inf")):
            raise UsageError(f"--{flag.replace('_', '-')} {value}: must be a number of seconds >= 0")


def api_keys(args: argparse.Namespace) -> dict[str, str]:
    """``key -> namespace`` from ``--api-keys FILE`` and the ``--api-key`` flags (one key: one
    namespace, as before; each repeated key gets its own)."""
    from ragpic.errors import ConfigError, UsageError
    from ragpic.serve.tenants import read_keys_file

    keys: dict[str, str] = {}
    if args.api_keys:
        try:
            keys.update(read_keys_file(args.api_keys))
        except ConfigError as exc:  # its message names the file and the line
            raise UsageError(f"--api-keys: {exc}") from None
        except (OSError, ValueError) as exc:  # unreadable, not text
            raise UsageError(f"--api-keys {args.api_keys}: {exc}") from None
    flags = args.api_key or ([os.environ["RAGPIC_API_KEY"]] if os.environ.get("RAGPIC_API_KEY") else [])
    for n, key in enumerate(flags, 1):
        keys.setdefault(key, "default" if len(flags) == 1 else f"key{n}")
    return keys


def default_store() -> str:
    from ragpic.paths import cache_dir

    return str(cache_dir() / "serve" / "kv")


def run(args: argparse.Namespace) -> int:
    """Load the engine, then serve until interrupted."""
    import uvicorn

    from ragpic.config import Config
    from ragpic.engine.engine import RagPic
    from ragpic.serve.app import ServeSettings, create_app
    from ragpic.serve.server import GracefulServer, protocol_with_header_timeout

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    engine = RagPic(Config(model=args.model, store=args.store or default_store(), method=args.method,
                           device=args.device, dtype=args.dtype, weights=args.weights,
                           hold_dense=args.hold_dense, prefix_cache_tokens=args.prefix_cache_tokens,
                           memory_cache_mb=args.memory_cache_mb,
                           compile_behind=args.compile_behind,
                           **({} if args.compile_head is None else {"compile_head": args.compile_head})))
    settings = ServeSettings(model_id=args.model_id or engine.lm.name, api_keys=args.keys,
                             max_batch=args.max_batch, max_queue=args.max_queue,
                             max_body_bytes=args.max_body_mb << 20, max_prompt_tokens=args.max_prompt_tokens,
                             link_piece=args.link_piece or None, max_kv_rows=args.max_kv_rows or None,
                             body_timeout=args.body_timeout or None, docs=args.docs,
                             max_compile_tokens=args.max_compile_tokens or None)
    app = create_app(engine, settings)
    method = ("auto = " if args.method.strip().lower() == "auto" else "") + engine.method_of().label
    print(f"ragpic serve: {settings.model_id} ({method}) on http://{args.host}:{args.port}/v1", flush=True)
    http = protocol_with_header_timeout(args.header_timeout) if args.header_timeout else "h11"
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, http=http,
                            timeout_graceful_shutdown=5)
    GracefulServer(config, app.state.scheduler, args.shutdown_grace, drain=app.state.drain).run()
    engine.close()
    return 0
