"""The completion routes' logic: check the request, queue a job, answer with JSON or SSE.

:class:`Completions` holds what every completion request needs (the engine, the scheduler,
the limits) and turns a job's events (:mod:`.job`) into the response. Every failure before
the first token is a JSON error with the right status; after it (headers sent), an SSE error
event ends the stream. A client that goes away, or a finished answer, cancels the job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from fastapi import Request
from starlette.responses import JSONResponse, StreamingResponse

from ragpic.core.methods import parse_method
from ragpic.errors import ContextOverflowError, RagPicError, StoreError
from ragpic.serve.bodies import BadRequest, Parsed, parse_body
from ragpic.serve.context_cache import texts_of
from ragpic.serve.job import GenJob
from ragpic.serve.responses import DONE, Reply, error_response, finish_reason
from ragpic.serve.scheduler import QueueFull, Scheduler

__all__ = ["Completions", "error_of", "read_json"]

log = logging.getLogger("ragpic.serve")
CHARS_PER_TOKEN_MAX = 16  # no tokenizer makes a token of more: a cheap bound before tokenizing


def error_of(exc: BaseException) -> JSONResponse:
    """The JSON error response for an exception raised while handling a request."""
    if isinstance(exc, BadRequest):
        return error_response(exc.status, str(exc), param=exc.param, code=exc.code)
    if isinstance(exc, ContextOverflowError):
        return error_response(400, str(exc), param="messages", code="context_length_exceeded")
    if isinstance(exc, StoreError):
        return error_response(503, f"the KV store failed: {exc}", code="store_unavailable")
    if isinstance(exc, (ValueError, RagPicError)):
        return error_response(400, str(exc))
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


class Completions:
    """``/v1/chat/completions`` (``chat=True``) and ``/v1/completions`` over one scheduler.

    Args:
        model_ids: names accepted as ``model`` (the first is the one advertised).
        body_limit: largest request body in bytes.
    """

    def __init__(self, engine, sched: Scheduler, model_ids: list[str], body_limit: int):
        self.engine, self.sched, self.model_ids, self.body_limit = engine, sched, model_ids, body_limit

    async def handle(self, request: Request, chat: bool):
        try:
            p = parse_body(await read_json(request, self.body_limit), chat=chat)
            job = await self._job(p)
        except Exception as exc:
            return error_of(exc)
        return await self._answer(job, p, Reply(p.model, chat=chat))

    async def _job(self, p: Parsed) -> GenJob:
        if p.model not in self.model_ids:
            raise BadRequest(f"model {p.model!r} is not served here: use {self.model_ids[0]!r} (GET /v1/models)",
                             status=404, param="model", code="model_not_found")
        if p.method is not None:
            parse_method(p.method)
        self.engine.sampling(**p.sampling)  # checks every value (ConfigError -> 400)
        chars = sum(len(m["content"]) for m in p.messages) if p.messages else len(p.prompt)
        limit = self.sched.max_prompt_tokens
        if chars > limit * CHARS_PER_TOKEN_MAX:
            raise ContextOverflowError(f"the prompt has {chars} characters, more than {limit} tokens can hold")
        hints = list(p.hints) + (await self._cached_texts(p.cache_ids) if p.cache_ids else [])
        return GenJob(messages=p.messages, prompt=p.prompt, sampling=p.sampling, method=p.method,
                      hints=hints or None, arrived=time.perf_counter()).bind()

    async def _cached_texts(self, ids: list[str]) -> list[str]:
        found = await asyncio.to_thread(texts_of, self.engine, ids)
        unknown = [i for i in ids if i not in found]
        if unknown:
            raise BadRequest(f"unknown cache id {unknown[0]!r}: POST /v1/context_cache returns ids",
                             status=404, param="cache_ids", code="cache_id_not_found")
        return [found[i] for i in ids]

    async def _answer(self, job: GenJob, p: Parsed, reply: Reply):
        try:
            self.sched.submit(job)
        except QueueFull as exc:
            return error_response(429, f"server busy, retry later: {exc}", code="queue_full", kind="rate_limit_error")
        try:
            kind, payload = await job.next_event()
            if kind == "error":
                return error_of(payload)
            if p.stream:
                return StreamingResponse(self._sse(job, reply, p.include_usage), media_type="text/event-stream")
            return await self._whole(job, reply)
        finally:
            if not p.stream:
                job.cancelled = True  # done, failed, or the handler was cancelled: stop decoding

    async def _whole(self, job: GenJob, reply: Reply):
        text = []
        while True:
            kind, payload = await job.next_event()
            if kind == "delta":
                text.append(payload)
            elif kind == "error":
                return error_of(payload)
            else:
                payload.text = "".join(text)
                return JSONResponse(reply.whole(payload))

    async def _sse(self, job: GenJob, reply: Reply, include_usage: bool):
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
