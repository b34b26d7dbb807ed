"""OpenAI response bodies (whole and streamed as SSE chunks) and JSON error bodies.

``usage`` is OpenAI's, with ``prompt_tokens_details.cached_tokens`` = prompt tokens whose KV
came from the store and were not recomputed (``cached + recomputed = prompt`` in the
``ragpic`` object); every body also carries a ``ragpic`` extension object with the link's
statistics (method, recomputed tokens, chunks matched/loaded/compiled, link and TTFT times).
"""

from __future__ import annotations

import json
import time
import uuid

from starlette.responses import JSONResponse

from ragpic.engine.generation import Generation

__all__ = ["error_response", "finish_reason", "Reply"]


def error_response(status: int, message: str, *, param: str | None = None, code: str | None = None,
                   kind: str | None = None) -> JSONResponse:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status)


def finish_reason(g: Generation) -> str:
    """OpenAI's reason: ``length`` when ``max_tokens`` ran out, else ``stop`` (EOS or a stop string)."""
    return "length" if g.finish_reason == "length" else "stop"


def ragpic_stats(g: Generation) -> dict:
    """The ``ragpic`` extension field: how the prompt was linked."""
    return {"method": g.method, "prompt_tokens": g.prompt_tokens, "recomputed_tokens": g.recomputed_tokens,
            "cached_tokens": g.cached_tokens, "compiled_tokens": g.compiled_tokens,
            "chunks_matched": g.chunks_matched, "chunks_loaded": g.chunks_loaded,
            "chunks_compiled": g.chunks_compiled, "chunks_behind": g.chunks_behind, "hints": g.hints,
            "hints_found": g.hints_found,
            "link_s": round(g.link_s, 6), "ttft_s": round(g.ttft_s, 6), "token_ids": list(g.token_ids)}


class Reply:
    """Builds the bodies of one completion: ``chat`` (``chat.completion``) or ``text_completion``."""

    def __init__(self, model: str, *, chat: bool):
        self.model, self.chat = model, chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, g: Generation) -> dict:
        """The non-streamed body."""
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": g.text}, "logprobs": None,
                      "finish_reason": finish_reason(g)}
        else:
            choice = {"index": 0, "text": g.text, "logprobs": None, "finish_reason": finish_reason(g)}
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": g.usage(), "ragpic": ragpic_stats(g)}

    def chunk(self, text: str | None, *, first: bool = False, reason: str | None = None) -> str:
        """One SSE event with a text delta (``reason`` on the last one)."""
        if self.chat:
            delta: dict = {"role": "assistant", "content": text or ""} if first else {"content": text} if text else {}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            body = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            body = {**self._head("text_completion"),
                    "choices": [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}]}
        return sse(body)

    def usage_chunk(self, g: Generation) -> str:
        """The last event with ``stream_options.include_usage``: no choices, the usage."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return sse({**self._head(obj), "choices": [], "usage": g.usage(), "ragpic": ragpic_stats(g)})


def sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"
