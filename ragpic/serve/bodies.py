"""OpenAI request bodies -> checked :class:`~ragpic.serve.job.GenJob` fields, or a :class:`BadRequest`.

Fields OpenAI clients send that change nothing here (``user``, ``stream_options``...) are
accepted; fields whose non-default value ragpic cannot honour (``n > 1``, ``logprobs``,
``tools``, penalties) are refused with a message naming them, never silently ignored.
Extension fields: ``cache_ids`` (ids from ``POST /v1/context_cache``), ``hints`` (chunk
texts expected in the prompt) and ``method`` (a link method for this request).
"""

from __future__ import annotations

from dataclasses import dataclass

from ragpic.errors import BadRequest  # importable from here too

__all__ = ["BadRequest", "Parsed", "parse_body"]

_REFUSED_UNLESS_DEFAULT = {"logprobs": (None, False), "top_logprobs": (None, 0), "tools": (None, []),
                           "tool_choice": (None, "none", "auto"), "functions": (None, []),
                           "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
                           "logit_bias": (None, {}), "best_of": (None, 1), "echo": (None, False),
                           "suffix": (None, ""), "response_format": (None, {"type": "text"})}


@dataclass(slots=True)
class Parsed:
    """A checked completion request (before cache ids are resolved)."""

    model: str
    stream: bool
    include_usage: bool
    messages: list[dict] | None
    prompt: str | None
    sampling: dict
    method: str | None
    cache_ids: list[str]
    hints: list[str]


def _field(body: dict, name: str, kinds: tuple[type, ...], what: str):
    value = body.get(name)
    if value is not None and (not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds):
        raise BadRequest(f"{name} must be {what}, got {type(value).__name__} {value!r:.40}", param=name)
    return value


def _strings(body: dict, name: str) -> list[str]:
    value = body.get(name) or []
    if isinstance(value, str) or not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"{name} must be a list of strings", param=name)
    return list(value)


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a string role", param=f"messages[{i}]")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]: text parts only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise BadRequest(f"messages[{i}].content: only text parts are supported", param=f"messages[{i}]")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string", param=f"messages[{i}].content")
        out.append({"role": m["role"], "content": content})
    return out


def _prompt(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("prompt must be a non-empty string (one prompt per request)", param="prompt")
    return prompt


def _sampling(body: dict) -> dict:
    max_tokens = _field(body, "max_tokens", (int,), "an integer >= 1")
    if max_tokens is None:
        max_tokens = _field(body, "max_completion_tokens", (int,), "an integer >= 1")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)):
        raise BadRequest("stop must be a string or a list of non-empty strings", param="stop")
    out = {"max_new_tokens": max_tokens, "temperature": _field(body, "temperature", (int, float), "a number >= 0"),
           "top_p": _field(body, "top_p", (int, float), "a number in (0, 1]"),
           "seed": _field(body, "seed", (int,), "an integer >= 0"), "stop": tuple(stop) if stop else None}
    return {k: v for k, v in out.items() if v is not None}


def parse_body(body: object, *, chat: bool) -> Parsed:
    """Check a decoded JSON body of ``/v1/chat/completions`` (``chat``) or ``/v1/completions``."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model is required: a model id from GET /v1/models", param="model")
    n = body.get("n", 1)
    if n not in (None, 1):
        raise BadRequest(f"n must be 1 (got {n!r}): ragpic generates one choice per request", param="n")
    for name, defaults in _REFUSED_UNLESS_DEFAULT.items():
        if name in body and body[name] not in defaults:
            raise BadRequest(f"{name}={body[name]!r:.40} is not supported by ragpic serve", param=name)
    stream = bool(_field(body, "stream", (bool,), "true or false"))
    options = body.get("stream_options") or {}
    method = _field(body, "method", (str,), "a link method name (legolink-16, naive, full...)")
    return Parsed(model=model, stream=stream, include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
                  messages=_messages(body) if chat else None, prompt=None if chat else _prompt(body),
                  sampling=_sampling(body), method=method, cache_ids=_strings(body, "cache_ids"),
                  hints=_strings(body, "hints"))
