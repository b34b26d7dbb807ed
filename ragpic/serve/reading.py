"""Reading a request body: size and time bounds, JSON, and strings the model can take.

:func:`read_json` is the one way a route reads its body. It answers :class:`BadRequest`
(never a 500) for every body a client can send: over the size limit (413), a body that
stops arriving (408 after ``timeout`` seconds without a byte: a Content-Length longer than
the body must not hold a connection and a handler forever), not JSON, nested deeper than
:data:`MAX_DEPTH`, or holding a string that is not valid Unicode (a lone surrogate such as
``"\\ud800"`` decodes from JSON but no tokenizer can encode it).
"""

from __future__ import annotations

import asyncio
import json

from fastapi import Request

from ragpic.serve.bodies import BadRequest

__all__ = ["MAX_DEPTH", "check_strings", "read_json"]

MAX_DEPTH = 32  # no OpenAI body nests deeper than ~6; the bound keeps every walk of it shallow


async def read_json(request: Request, limit: int, timeout: float | None = None) -> object:
    """The decoded, checked body, or BadRequest (413 over ``limit`` bytes, 408 when no byte came
    for ``timeout`` seconds, 400 not JSON / too deep / invalid Unicode)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"the request body has {declared} bytes, over the limit of {limit}", status=413)
    raw = bytearray()
    parts = request.stream().__aiter__()
    while True:
        try:
            part = await asyncio.wait_for(parts.__anext__(), timeout)
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            raise BadRequest(f"the request body stopped arriving: no byte in {timeout:g} s (--body-timeout)",
                             status=408, code="request_timeout") from None
        raw += part
        if len(raw) > limit:
            raise BadRequest(f"the request body is over the limit of {limit} bytes", status=413)
    try:
        body = json.loads(raw)
    except RecursionError:
        raise BadRequest(f"the request body nests deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {str(exc)[:100]}") from None
    check_strings(body)
    return body


def check_strings(body: object) -> None:
    """Raise BadRequest for nesting deeper than :data:`MAX_DEPTH` or a string (key or value)
    that is not valid Unicode; ``param`` is its path (``messages[0].content``). Iterative:
    no recursion for a client to exhaust."""
    todo: list[tuple[object, str, int]] = [(body, "", 0)]
    while todo:
        value, path, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise BadRequest(f"the request body nests deeper than {MAX_DEPTH} levels", param=path or None)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise BadRequest(f"{path or 'the body'} is not valid Unicode: a lone surrogate at character "
                                 f"{exc.start}", param=path or None) from None
        elif isinstance(value, dict):
            for k, v in value.items():
                try:  # a bad key is named by its parent's path (never echoed: it cannot be encoded)
                    k.encode("utf-8")
                except UnicodeEncodeError:
                    raise BadRequest(f"a key in {path or 'the body'} is not valid Unicode",
                                     param=path or None) from None
                todo.append((v, f"{path}.{k}" if path else k, depth + 1))
        elif isinstance(value, list):
            todo.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value))
