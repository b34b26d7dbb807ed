"""The FastAPI app: OpenAI routes, health, metrics; EPIC's cache API is in :mod:`.context_cache`.

:func:`create_app` wires one engine and one :class:`~.scheduler.Scheduler`: the completion
routes (:mod:`.completions`) check each request (every failure a JSON 4xx naming what to fix),
hand a job to the scheduler and answer with JSON or an SSE stream. Nothing a request does can
stop the process: errors become responses, and a client that goes away cancels its job.
Every route but ``/health`` is behind the API key, the docs routes included (and those are
off unless ``docs``: they load scripts from a CDN); ``/health`` answers 503 ``draining`` once
``app.state.drain()`` ran (the shutdown grace). A request framed twice (Content-Length
and Transfer-Encoding) is refused: a proxy in front may frame it the other way (smuggling).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, PlainTextResponse

from ragpic.serve.bodies import quote
from ragpic.serve.completions import Completions, error_of, read_json
from ragpic.serve.context_cache import add_cache_routes
from ragpic.serve.metrics import Metrics
from ragpic.serve.responses import error_response
from ragpic.serve.scheduler import Scheduler
from ragpic.serve.tenant_records import records_for
from ragpic.serve.tenants import Tenants

if TYPE_CHECKING:
    from ragpic.engine.engine import RagPic

__all__ = ["ServeSettings", "create_app"]

log = logging.getLogger("ragpic.serve")


@dataclass(slots=True)
class ServeSettings:
    """Server limits. ``model_id``: the name clients pass as ``model`` (the loaded model's name is
    accepted too); ``max_prompt_tokens`` None: the model's context window; ``link_piece``: most
    rows a link recomputes between two decode steps (None: links run whole); ``body_timeout``:
    seconds a body may go without a byte (408); ``docs``: serve /docs, /redoc, /openapi.json;
    ``api_keys``: several keys, each mapped to a namespace (:mod:`.tenants`); ``max_compile_tokens``:
    most tokens one ``POST /v1/context_cache`` compiles (413 past it; None: no limit); ``max_kv_rows``:
    the KV-row budget of the linking and decoding requests (None: ``max_batch`` x the model's window)."""

    model_id: str
    api_key: str | None = None
    api_keys: dict[str, str] | None = None  # key -> namespace (tenants); api_key joins as "default"
    max_batch: int = 8
    max_queue: int = 64
    max_body_bytes: int = 4 << 20
    max_prompt_tokens: int | None = None
    link_piece: int | None = 512
    body_timeout: float | None = 30.0
    docs: bool = False
    max_compile_tokens: int | None = 32768
    max_kv_rows: int | None = None


_GAUGES = {"queue_depth": ("queued", "requests waiting beyond the batch (bounded by --max-queue)"),
           "requests_matching": ("matching", "requests being matched against the store"),
           "requests_linking": ("linking", "requests admitted to the batch, linking or waiting for their link"),
           "requests_decoding": ("decoding", "requests being decoded"),
           "active_requests": ("active", "requests being matched, linked or decoded"),
           "compiles_running": ("compiling", "compiles in progress (context-cache API and compile on a miss)")}


def _gauges(metrics: Metrics, sched: Scheduler) -> None:
    for name, (key, doc) in _GAUGES.items():
        metrics.gauges[name] = (doc, lambda key=key: sched.gauges()[key])
    # the bounded memories a server fills as it runs, so a growing RSS can be told from a leak
    metrics.gauges["store_memory_bytes"] = ("bytes of decoded KV held in front of the store (at most --memory-cache-mb)",
                                            lambda: sched.engine.store.memory_bytes)
    metrics.gauges["cache_pool_idle_bytes"] = ("bytes of idle linked-cache slabs kept for the next requests",
                                               lambda: sched.pool.idle_bytes)


class Guard:
    """Pure ASGI middleware, before routing (so the docs routes are covered too): refuses a
    request framed twice and, with an API key set, one without it (``/health`` stays open:
    load balancers probe it without a key). Pure ASGI so the handlers' own ``receive`` still
    sees the client's disconnect."""

    def __init__(self, app, tenants: Tenants):
        self.app, self.tenants = app, tenants

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if b"content-length" in headers and b"transfer-encoding" in headers:
                r = error_response(400, "a request must not carry both Content-Length and Transfer-Encoding")
                r.headers["Connection"] = "close"
                return await r(scope, receive, send)
            auth = headers.get(b"authorization")
            namespace = self.tenants.namespace(auth.decode("latin-1") if auth else None)
            if namespace is None and scope["path"] != "/health":
                r = error_response(401, "missing or wrong API key: send Authorization: Bearer <key>",
                                   code="invalid_api_key")
                return await r(scope, receive, send)
            scope.setdefault("state", {})["namespace"] = namespace or ""
        await self.app(scope, receive, send)


def _add_drain(app: FastAPI, sched: Scheduler) -> None:
    """``app.state.drain()``, called by the server at the first SIGTERM/SIGINT: refuse new work
    (the scheduler's 503s) and set ``app.state.draining`` (bool), which fails ``/health``."""
    app.state.draining = False

    def drain() -> None:
        app.state.draining = True  # kept here: the scheduler's own flag is private
        sched.drain()

    app.state.drain = drain


def create_app(engine: "RagPic", settings: ServeSettings) -> FastAPI:
    """An app serving ``engine``; its scheduler thread starts and stops with the app."""
    metrics = Metrics()
    sched = Scheduler(engine, max_batch=settings.max_batch, max_queue=settings.max_queue,
                      max_prompt_tokens=settings.max_prompt_tokens, link_piece=settings.link_piece,
                      max_kv_rows=settings.max_kv_rows, metrics=metrics)
    _gauges(metrics, sched)
    model_ids = [settings.model_id, engine.lm.name]
    keys = dict(settings.api_keys or {})
    if settings.api_key:
        keys.setdefault(settings.api_key, "default")
    tenants = Tenants(keys)
    if not tenants.shared:  # several namespaces: their ids live where the store lives (docs/SERVING.md, *Tenants*)
        tenants.records = records_for(engine.store.backend)
        log.info("tenant records: %s", tenants.records.where)
    completions = Completions(engine, sched, model_ids, settings.max_body_bytes, settings.body_timeout, tenants)

    @asynccontextmanager
    async def lifespan(_app):
        sched.start()
        try:
            yield
        finally:
            sched.stop()
            tenants.close()

    docs = {} if settings.docs else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="ragpic serve", lifespan=lifespan, **docs)
    app.state.scheduler, app.state.metrics, app.state.engine = sched, metrics, engine
    _add_drain(app, sched)

    app.add_middleware(Guard, tenants=tenants)

    @app.exception_handler(HTTPException)
    async def http_error(_req, exc: HTTPException):
        return error_response(exc.status_code, str(exc.detail)[:200])

    @app.exception_handler(Exception)
    async def any_error(_req, exc: Exception):
        return error_of(exc)

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        state = {"model": settings.model_id, **sched.gauges()}
        if app.state.draining:  # a 503 takes the replica out of a balancer's (or readiness probe's) pool
            return JSONResponse({"status": "draining", **state}, status_code=503, headers={"Retry-After": "1"})
        return {"status": "ok", **state}

    @app.get("/metrics")
    async def metrics_text():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    def model_card(model_id: str) -> dict:
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "ragpic"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card(settings.model_id)]}

    @app.get("/v1/models/{model_id:path}")
    async def one_model(model_id: str):
        if model_id not in model_ids:
            return error_response(404, f"model {quote(model_id)} is not served here: use {settings.model_id!r}",
                                  param="model", code="model_not_found")
        return model_card(model_id)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await completions.handle(request, chat=True)

    @app.post("/v1/completions")
    async def text_completions(request: Request):
        return await completions.handle(request, chat=False)

    add_cache_routes(app, engine, sched, settings.max_body_bytes,
                     lambda request, limit: read_json(request, limit, settings.body_timeout), error_of, tenants,
                     settings.max_compile_tokens)
    return app
