"""The FastAPI app: OpenAI routes, health, metrics; EPIC's cache API is in :mod:`.context_cache`.

:func:`create_app` wires one engine and one :class:`~.scheduler.Scheduler`: handlers check the
request (every failure a JSON 4xx naming what to fix), hand a :class:`~.job.GenJob` to the
scheduler and turn its events into a JSON body or an SSE stream. Nothing a request does can
stop the process: errors become responses, and a client that goes away cancels its job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Depends, FastAPI, Request
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse

from ragpic.core.methods import parse_method
from ragpic.errors import ContextOverflowError, RagPicError, StoreError
from ragpic.serve.bodies import BadRequest, Parsed, parse_body
from ragpic.serve.context_cache import add_cache_routes, texts_of
from ragpic.serve.job import GenJob
from ragpic.serve.metrics import Metrics
from ragpic.serve.responses import DONE, Reply, error_response, finish_reason
from ragpic.serve.scheduler import QueueFull, Scheduler

__all__ = ["ServeSettings", "create_app"]

log = logging.getLogger("ragpic.serve")
CHARS_PER_TOKEN_MAX = 16  # no tokenizer makes a token of more: a cheap bound before tokenizing


@dataclass(slots=True)
class ServeSettings:
    """Server limits. ``model_id``: the name clients pass as ``model`` (the loaded model's name is
    accepted too); ``max_prompt_tokens`` None: the model's context window."""

    model_id: str
    api_key: str | None = None
    max_batch: int = 8
    max_queue: int = 64
    max_body_bytes: int = 4 << 20
    max_prompt_tokens: int | None = None


def _error_of(exc: BaseException) -> JSONResponse:
    if isinstance(exc, BadRequest):
        return error_response(exc.status, str(exc), param=exc.param, code=exc.code)
    if isinstance(exc, ContextOverflowError):
        return error_response(400, str(exc), param="messages", code="context_length_exceeded")
    if isinstance(exc, (ValueError, RagPicError)) and not isinstance(exc, StoreError):
        return error_response(400, str(exc))
    if isinstance(exc, StoreError):
        return error_response(503, f"the KV store failed: {exc}", code="store_unavailable")
    log.error("request failed: %r", exc)
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


async def read_json(request: Request, limit: int) -> object:
    """The decoded body, or BadRequest (413 over ``limit`` bytes, 400 not JSON)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"the request body has {declared} bytes, over the limit of {limit}", status=413)
    raw = bytearray()
    async for part in request.stream():
        raw += part
        if len(raw) > limit:
            raise BadRequest(f"the request body is over the limit of {limit} bytes", status=413)
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None


def create_app(engine, settings: ServeSettings) -> FastAPI:
    """An app serving ``engine``; its scheduler thread starts and stops with the app."""
    metrics = Metrics()
    sched = Scheduler(engine, max_batch=settings.max_batch, max_queue=settings.max_queue,
                      max_prompt_tokens=settings.max_prompt_tokens, metrics=metrics)
    metrics.gauges.update(queue_depth=("requests waiting to be linked", lambda: sched.queued),
                          active_requests=("requests being decoded", lambda: sched.active))
    model_ids = {settings.model_id, engine.lm.name}

    @asynccontextmanager
    async def lifespan(_app):
        sched.start()
        try:
            yield
        finally:
            sched.stop()

    def auth(request: Request) -> None:  # /health stays open: load balancers probe it without a key
        if settings.api_key and request.url.path != "/health" and request.headers.get("authorization") != f"Bearer {settings.api_key}":
            raise HTTPException(401, "missing or wrong API key: send Authorization: Bearer <key>")

    app = FastAPI(title="ragpic serve", lifespan=lifespan, dependencies=[Depends(auth)])
    app.state.scheduler, app.state.metrics, app.state.engine = sched, metrics, engine

    @app.exception_handler(HTTPException)
    async def http_error(_req, exc: HTTPException):
        return error_response(exc.status_code, str(exc.detail), code="invalid_api_key" if exc.status_code == 401 else None)

    @app.exception_handler(Exception)
    async def any_error(_req, exc: Exception):
        return _error_of(exc)

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

    async def complete(request: Request, chat: bool):
        try:
            p = parse_body(await read_json(request, settings.max_body_bytes), chat=chat)
            job = await _job(p)
        except Exception as exc:
            return _error_of(exc)
        return await _answer(job, p, Reply(p.model, chat=chat))

    async def _job(p: Parsed) -> GenJob:
        if p.model not in model_ids:
            raise BadRequest(f"model {p.model!r} is not served here: use {settings.model_id!r} (GET /v1/models)",
                             status=404, param="model", code="model_not_found")
        if p.method is not None:
            parse_method(p.method)
        engine.sampling(**p.sampling)  # checks every value (ConfigError -> 400)
        chars = sum(len(m["content"]) for m in p.messages) if p.messages else len(p.prompt)
        limit = sched.max_prompt_tokens
        if chars > limit * CHARS_PER_TOKEN_MAX:
            raise ContextOverflowError(f"the prompt has {chars} characters, more than {limit} tokens can hold")
        hints = list(p.hints)
        if p.cache_ids:
            hints += await _cached_texts(p.cache_ids)
        return GenJob(messages=p.messages, prompt=p.prompt, sampling=p.sampling, method=p.method,
                      hints=hints or None, arrived=time.perf_counter()).bind()

    async def _cached_texts(ids: list[str]) -> list[str]:
        found = await asyncio.to_thread(texts_of, engine, ids)
        unknown = [i for i in ids if i not in found]
        if unknown:
            raise BadRequest(f"unknown cache id {unknown[0]!r}: POST /v1/context_cache returns ids",
                             status=404, param="cache_ids", code="cache_id_not_found")
        return [found[i] for i in ids]

    async def _answer(job: GenJob, p: Parsed, reply: Reply):
        try:
            sched.submit(job)
        except QueueFull as exc:
            return error_response(429, f"server busy, retry later: {exc}", code="queue_full", kind="rate_limit_error")
        try:
            kind, payload = await job.next_event()
            if kind == "error":
                return _error_of(payload)
            if p.stream:
                return StreamingResponse(_sse(job, reply, p.include_usage), media_type="text/event-stream")
            text = []
            while True:
                kind, payload = await job.next_event()
                if kind == "delta":
                    text.append(payload)
                elif kind == "error":
                    return _error_of(payload)
                else:
                    payload.text = "".join(text)
                    return JSONResponse(reply.whole(payload))
        finally:
            if not p.stream:
                job.cancelled = True  # done, failed, or the handler was cancelled: stop decoding

    async def _sse(job: GenJob, reply: Reply, include_usage: bool):
        try:
            yield reply.chunk("", first=True)
            while True:
                kind, payload = await job.next_event()
                if kind == "delta":
                    yield reply.chunk(payload)
                elif kind == "error":  # headers are sent: an error event, then the end
                    yield f"data: {json.dumps({'error': {'message': str(payload), 'type': 'server_error'}})}\n\n"
                    break
                else:
                    yield reply.chunk(None, reason=finish_reason(payload))
                    if include_usage:
                        yield reply.usage_chunk(payload)
                    break
            yield DONE
        finally:
            job.cancelled = True  # finished, or the client went away mid-stream

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)

    add_cache_routes(app, engine, sched, settings.max_body_bytes, read_json, _error_of)
    return app
