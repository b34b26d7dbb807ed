"""EPIC's explicit context-cache API: compile chunk texts now, name them by id later.

- ``POST /v1/context_cache`` ``{"texts": [...], "method": optional}`` compiles and stores
  every text (one store entry each) and answers ``{"data": [{"id", "tokens", "compiled"}]}``.
  An id is the store key: a hash of (model, exact text, compile recipe, dtype), so the same
  text gets the same id from every worker sharing the store.
- ``GET /v1/context_cache/{id}``: the text and token count of a stored chunk, or 404.
- ``DELETE /v1/context_cache/{id}``: drop it from the store (404 when absent).

A completion request may then name ``cache_ids``: their texts become the request's hints.
With several tenants (:mod:`.tenants`) ids are per namespace: each caller sees, reads and
deletes only its own, and ``compiled`` means "new in the caller's namespace"; the records
live in the store's medium (:mod:`.tenant_records`), so every replica of a store answers alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import asyncio

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse

from ragpic.engine.compile_plan import plan_compile
from ragpic.engine.compiling import tokenized
from ragpic.errors import ChunkError, ClientGone
from ragpic.serve.bodies import BadRequest, quote
from ragpic.serve.tenants import Tenants

if TYPE_CHECKING:
    from ragpic.engine.engine import RagPic
    from ragpic.serve.scheduler import Scheduler

__all__ = ["add_cache_routes", "namespace_of", "texts_of"]

MAX_TEXTS = 1024


def texts_of(engine: "RagPic", ids: list[str]) -> dict[str, str]:
    """``id -> text`` of the ids that are stored (blocking: the store may be remote)."""
    present = {i for i, hit in zip(ids, engine.store.contains_many(ids)) if hit}
    if not present:
        return {}
    known = engine.store.texts_of(sorted(present))
    return {i: known[i] for i in present if i in known}


def _texts(body: object) -> tuple[list[str], str | None]:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object with texts: [str, ...]")
    texts = body.get("texts")
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise BadRequest("texts must be a non-empty list of chunk strings", param="texts")
    if len(texts) > MAX_TEXTS:
        raise BadRequest(f"at most {MAX_TEXTS} texts per request, got {len(texts)}", param="texts")
    method = body.get("method")
    if method is not None and not isinstance(method, str):
        raise BadRequest("method must be a link method name", param="method")
    return texts, method


class _Caller:
    """A compile's owner: ``cancelled`` once its client went away (the scheduler drops the rest)."""

    cancelled = False


async def _watch(request: Request, caller: _Caller) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    caller.cancelled = True


def _compile(engine: "RagPic", sched: "Scheduler", texts: list[str], method: str | None, max_tokens: int | None, caller) -> list[dict]:
    """On a worker thread: check (the rules of ``RagPic.compile``: :func:`plan_compile`), compile
    what is new in pieces on the scheduler (between decode steps, docs/SERVING.md, *The turn*),
    and describe every text."""
    m = engine.method_of(method)  # parsed here, once
    counts = [engine.count_tokens(t) for t in texts]
    _bound(counts, max_tokens)
    try:  # a text named explicitly is never skipped
        plan = plan_compile(engine, texts, m, refuse_short=True, tokens=counts)
    except ChunkError as e:
        raise BadRequest(str(e), param=f"texts[{e.index}]" if e.index is not None else "texts") from None
    sched.compile(tokenized(engine, plan.todo), m, caller)
    return [{"id": k, "object": "context_cache", "tokens": n, "compiled": not hit}
            for k, n, hit in zip(plan.keys, plan.tokens, plan.stored)]


def namespace_of(request: Request) -> str:
    """The caller's namespace (set by the app's key check)."""
    return request.scope.get("state", {}).get("namespace", "")


def _bound(counts: list[int], max_tokens: int | None) -> None:
    """413 for a compile over ``max_tokens`` tokens: it runs in pieces between decode steps, but
    its size still bounds how long the model works for one request (docs/SERVING.md, *Limits*)."""
    if max_tokens is None:
        return
    total = sum(counts)
    if total > max_tokens:
        raise BadRequest(f"the texts hold {total} tokens, over this server's limit of {max_tokens} per request "
                         f"(--max-compile-tokens): send them in several requests", status=413, param="texts")


def add_cache_routes(app: FastAPI, engine: "RagPic", sched: "Scheduler", limit: int, read_json, error_of, tenants: Tenants,
                     max_compile_tokens: int | None = None) -> None:
    """Add the three routes to ``app`` (compiles run in pieces on ``sched``'s turns)."""

    @app.post("/v1/context_cache")
    async def create(request: Request):
        try:
            texts, method = _texts(await read_json(request, limit))
            caller = _Caller()
            watcher = asyncio.create_task(_watch(request, caller))  # a client that leaves cancels the rest
            try:
                data = await asyncio.to_thread(_compile, engine, sched, texts, method, max_compile_tokens, caller)
            finally:
                watcher.cancel()
            if caller.cancelled:
                raise ClientGone("the client went away")
            sched.metrics.inc("chunks_compiled", sum(d["compiled"] for d in data))  # store misses, any tenant
            named = await asyncio.to_thread(tenants.add, namespace_of(request), [d["id"] for d in data],
                                            [not d["compiled"] for d in data])  # the records may be remote
        except Exception as exc:
            return error_of(exc)
        for d, (cid, new) in zip(data, named):
            d["id"], d["compiled"] = cid, new
        return {"object": "list", "data": data, "compiled": sum(d["compiled"] for d in data)}

    async def _one(request: Request, cache_id: str) -> tuple[str, str]:
        key = (await asyncio.to_thread(tenants.resolve, namespace_of(request), [cache_id], "id"))[cache_id]
        found = await asyncio.to_thread(texts_of, engine, [key])
        if key not in found:
            raise BadRequest(f"unknown cache id {quote(cache_id)}", status=404, param="id", code="cache_id_not_found")
        return key, found[key]

    @app.get("/v1/context_cache/{cache_id}")
    async def get(request: Request, cache_id: str):
        try:
            _key, text = await _one(request, cache_id)
        except Exception as exc:
            return error_of(exc)
        return {"id": cache_id, "object": "context_cache", "text": text}

    @app.delete("/v1/context_cache/{cache_id}")
    async def delete(request: Request, cache_id: str):
        try:
            await _one(request, cache_id)
            last = await asyncio.to_thread(tenants.remove, namespace_of(request), cache_id)
            if last is not None:  # nobody else holds it: the store entry goes too
                await asyncio.to_thread(_delete, engine, last)
        except Exception as exc:
            return error_of(exc)
        return JSONResponse({"id": cache_id, "object": "context_cache", "deleted": True})


def _delete(engine: "RagPic", cache_id: str) -> None:
    engine.store.delete_many([cache_id])  # its catalog row and text go with it
