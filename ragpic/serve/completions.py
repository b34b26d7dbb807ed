"""The completion routes' logic: check the request, queue a job, answer with JSON or SSE.

:class:`Completions` holds what every completion request needs (the engine, the scheduler,
the limits) and turns a job's events (:mod:`.job`) into the response. Every failure before
the first token is a JSON error with the right status; after it (headers sent), an SSE error
event and ``[DONE]`` end the stream. A client that goes away cancels the job, streaming or
not (a non-streaming handler watches the connection while it waits), and so does a
finished answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import asyncio
import json
import logging
import time

from fastapi import Request
from starlette.responses import JSONResponse, StreamingResponse

from ragpic.errors import ContextOverflowError, RagPicError, StoreError
from ragpic.serve.bodies import BadRequest, Parsed, parse_body, quote
from ragpic.serve.context_cache import namespace_of, texts_of
from ragpic.serve.job import Delta, Done, Failed, GenJob
from ragpic.serve.reading import read_json
from ragpic.serve.responses import DONE, Reply, error_response, finish_reason
from ragpic.errors import ClientGone, QueueFull, ShuttingDown
from ragpic.serve.scheduler import Scheduler
from ragpic.serve.tenants import Tenants

if TYPE_CHECKING:
    from ragpic.engine.engine import RagPic

__all__ = ["Completions", "error_of", "read_json"]

log = logging.getLogger("ragpic.serve")
CHARS_PER_TOKEN_MAX = 16  # no tokenizer makes a token of more: a cheap bound before tokenizing


RETRY_AFTER_S = 1  # what a 429 or 503 asks a client to wait (OpenAI clients honour Retry-After)
MAX_MESSAGE = 1000  # an engine message quoting a client's text is cut (the checks quote <= 100 chars)


def error_of(exc: BaseException, field: str = "max_tokens") -> JSONResponse:
    """The JSON error response for an exception raised while handling a request; the engine's
    ``max_new_tokens`` is named as the client's ``field`` (``max_tokens`` or ``max_completion_tokens``)."""
    if isinstance(exc, BadRequest):
        return error_response(exc.status, str(exc), param=exc.param, code=exc.code)
    if isinstance(exc, ShuttingDown):
        return busy(503, str(exc), "shutting_down")
    if isinstance(exc, ClientGone):  # nobody reads this answer: no log, nginx's "client closed request"
        return error_response(499, str(exc), code="client_closed_request")
    text = str(exc).replace("max_new_tokens", field)[:MAX_MESSAGE]
    if isinstance(exc, ContextOverflowError):
        return error_response(400, text, param="messages", code="context_length_exceeded")
    if isinstance(exc, StoreError):
        return error_response(503, f"the KV store failed: {text}", code="store_unavailable")
    if isinstance(exc, (ValueError, RagPicError)):
        return error_response(400, text, param=field if field in text else None)
    log.error("request failed: %r", exc)
    return error_response(500, f"internal error: {type(exc).__name__}")


def busy(status: int, message: str, code: str) -> JSONResponse:
    """429 (queue full) or 503 (shutting down) with ``Retry-After``."""
    r = error_response(status, message, code=code, kind="rate_limit_error" if status == 429 else None)
    r.headers["Retry-After"] = str(RETRY_AFTER_S)
    return r


class Completions:
    """``/v1/chat/completions`` (``chat=True``) and ``/v1/completions`` over one scheduler.

    Args:
        model_ids: names accepted as ``model`` (the first is the one advertised).
        body_limit: largest request body in bytes.
    """

    def __init__(self, engine: "RagPic", sched: Scheduler, model_ids: list[str], body_limit: int,
                 body_timeout: float | None = None, tenants: Tenants | None = None):
        self.engine, self.sched, self.model_ids, self.body_limit = engine, sched, model_ids, body_limit
        self.body_timeout, self.tenants = body_timeout, tenants or Tenants()

    async def handle(self, request: Request, chat: bool):
        p = None
        try:
            p = parse_body(await read_json(request, self.body_limit, self.body_timeout), chat=chat)
            job = await self._job(p, namespace_of(request))
        except Exception as exc:
            return error_of(exc, p.max_tokens_field if p else "max_tokens")
        return await self._answer(request, job, p, Reply(p.model, chat=chat))

    async def _job(self, p: Parsed, namespace: str) -> GenJob:
        if p.model not in self.model_ids:
            raise BadRequest(f"model {quote(p.model)} is not served here: use {self.model_ids[0]!r} "
                             f"(GET /v1/models)", status=404, param="model", code="model_not_found")
        try:
            method = self.engine.method_of(p.method) if p.method is not None else None  # parsed here, once
            self.engine.sampling(**p.sampling)  # checks every value (ConfigError -> 400)
        except ValueError as exc:
            raise BadRequest(str(exc).replace("max_new_tokens", p.max_tokens_field)[:MAX_MESSAGE],
                             param="method" if p.method and p.method in str(exc) else None) from None
        chars = sum(len(m["content"]) for m in p.messages) if p.messages else len(p.prompt)
        limit = self.sched.max_prompt_tokens
        if chars > limit * CHARS_PER_TOKEN_MAX:
            raise ContextOverflowError(f"the prompt has {chars} characters, more than {limit} tokens can hold")
        hints = list(p.hints) + (await self._cached_texts(namespace, p.cache_ids) if p.cache_ids else [])
        return GenJob(messages=p.messages, prompt=p.prompt, sampling=p.sampling, method=method,
                      hints=hints or None, arrived=time.perf_counter(), tenant=self.tenants.view(namespace)).bind()

    async def _cached_texts(self, namespace: str, ids: list[str]) -> list[str]:
        # 404 for an id of another namespace; the records may be remote: off the event loop
        keys = await asyncio.to_thread(self.tenants.resolve, namespace, ids, "cache_ids")
        texts = await asyncio.to_thread(texts_of, self.engine, list(keys.values()))
        found = {i: texts[k] for i, k in keys.items() if k in texts}
        unknown = [i for i in ids if i not in found]
        if unknown:
            raise BadRequest(f"unknown cache id {quote(unknown[0])}: POST /v1/context_cache returns ids",
                             status=404, param="cache_ids", code="cache_id_not_found")
        return [found[i] for i in ids]

    async def _answer(self, request: Request, job: GenJob, p: Parsed, reply: Reply):
        try:
            self.sched.submit(job)
        except QueueFull as exc:
            self.sched.metrics.inc("requests", outcome="queue_full")
            return busy(429, f"server busy, retry later: {exc}", "queue_full")
        except ShuttingDown as exc:
            self.sched.metrics.inc("requests", outcome="shutting_down")
            return busy(503, str(exc), "shutting_down")
        # Until the answer starts (and, not streaming, until it ends) nothing reads the
        # connection: a watcher does, and cancels the job when the client goes away.
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
        streaming = False
        try:
            event = await job.next_event()
            if isinstance(event, Failed):
                return error_of(event.error, p.max_tokens_field)
            if p.stream:
                streaming = True
                return StreamingResponse(self._sse(job, reply, p.include_usage, watcher),
                                         media_type="text/event-stream")
            return await self._whole(job, reply, p.max_tokens_field)
        finally:
            if not streaming:
                watcher.cancel()
                job.cancelled = True  # done, failed, or the handler was cancelled: stop decoding

    async def _whole(self, job: GenJob, reply: Reply, field: str):
        while True:
            event = await job.next_event()
            if isinstance(event, Failed):
                return error_of(event.error, field)
            if isinstance(event, Done):  # its text is the deltas', joined by the request itself
                return JSONResponse(reply.whole(event.generation))

    async def _sse(self, job: GenJob, reply: Reply, include_usage: bool, watcher: asyncio.Task):
        watcher.cancel()  # Starlette's streaming response watches the connection from here on
        try:
            yield reply.chunk("", first=True)
            while True:
                event = await job.next_event()
                if isinstance(event, Delta):
                    yield reply.chunk(event.text)
                elif isinstance(event, Failed):  # headers are sent: an error event, then the end
                    code = "shutting_down" if isinstance(event.error, ShuttingDown) else None
                    error = {"message": str(event.error)[:MAX_MESSAGE], "type": "server_error", "param": None,
                             "code": code}
                    yield f"data: {json.dumps({'error': error})}\n\n"
                    break
                elif isinstance(event, Done):
                    yield reply.chunk(None, reason=finish_reason(event.generation))
                    if include_usage:
                        yield reply.usage_chunk(event.generation)
                    break
            yield DONE
        finally:
            job.cancelled = True  # finished, or the client went away mid-stream


async def _cancel_on_disconnect(request: Request, job: GenJob) -> None:
    """Wait for the client to go away (the body is read: the next message is the disconnect),
    then cancel the job and wake its handler (the scheduler drops a cancelled job silently)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancelled = True
    job.send(Failed(ClientGone("the client went away")))
