"""The FastAPI app: OpenAI routes, health, metrics; EPIC's cache API is in :mod:`.context_cache`.

:func:`create_app` wires one engine and one :class:`~.scheduler.Scheduler`: the completion
routes (:mod:`.completions`) check each request (every failure a JSON 4xx naming what to fix),
hand a job to the scheduler and answer with JSON or an SSE stream. Nothing a request does can
stop the process: errors become responses, and a client that goes away cancels its job.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Depends, FastAPI, Request
from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse

from ragpic.serve.completions import Completions, error_of, read_json
from ragpic.serve.context_cache import add_cache_routes
from ragpic.serve.metrics import Metrics
from ragpic.serve.responses import error_response
from ragpic.serve.scheduler import Scheduler

__all__ = ["ServeSettings", "create_app"]


@dataclass(slots=True)
class ServeSettings:
    """Server limits. ``model_id``: the name clients pass as ``model`` (the loaded model's name is
    accepted too); ``max_prompt_tokens`` None: the model's context window; ``link_piece``: most
    rows a link recomputes between two decode steps (None: links run whole)."""

    model_id: str
    api_key: str | None = None
    max_batch: int = 8
    max_queue: int = 64
    max_body_bytes: int = 4 << 20
    max_prompt_tokens: int | None = None
    link_piece: int | None = 512


def create_app(engine, settings: ServeSettings) -> FastAPI:
    """An app serving ``engine``; its scheduler thread starts and stops with the app."""
    metrics = Metrics()
    sched = Scheduler(engine, max_batch=settings.max_batch, max_queue=settings.max_queue,
                      max_prompt_tokens=settings.max_prompt_tokens, link_piece=settings.link_piece,
                      metrics=metrics)
    metrics.gauges.update(queue_depth=("requests waiting to be linked", lambda: sched.queued),
                          active_requests=("requests being linked or decoded", lambda: sched.active))
    completions = Completions(engine, sched, [settings.model_id, engine.lm.name], settings.max_body_bytes)

    @asynccontextmanager
    async def lifespan(_app):
        sched.start()
        try:
            yield
        finally:
            sched.stop()

    def auth(request: Request) -> None:  # /health stays open: load balancers probe it without a key
        if (settings.api_key and request.url.path != "/health"
                and request.headers.get("authorization") != f"Bearer {settings.api_key}"):
            raise HTTPException(401, "missing or wrong API key: send Authorization: Bearer <key>")

    app = FastAPI(title="ragpic serve", lifespan=lifespan, dependencies=[Depends(auth)])
    app.state.scheduler, app.state.metrics, app.state.engine = sched, metrics, engine

    @app.exception_handler(HTTPException)
    async def http_error(_req, exc: HTTPException):
        return error_response(exc.status_code, str(exc.detail), code="invalid_api_key" if exc.status_code == 401 else None)

    @app.exception_handler(Exception)
    async def any_error(_req, exc: Exception):
        return error_of(exc)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": settings.model_id, "active": sched.active, "queued": sched.queued}

    @app.get("/metrics")
    async def metrics_text():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": settings.model_id, "object": "model", "created": 0,
                                            "owned_by": "ragpic"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await completions.handle(request, chat=True)

    @app.post("/v1/completions")
    async def text_completions(request: Request):
        return await completions.handle(request, chat=False)

    add_cache_routes(app, engine, sched, settings.max_body_bytes, read_json, error_of)
    return app
