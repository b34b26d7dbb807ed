"""OpenAI request bodies -> checked :class:`~ragpic.serve.job.GenJob` fields, or a :class:`BadRequest`.

Validation follows OpenAI's to the letter: what OpenAI refuses is refused here with a 400
whose ``param`` is the field the client sent (``max_tokens`` or ``max_completion_tokens``,
never the engine's ``max_new_tokens``), and every field accepted is honoured. Fields OpenAI
clients send that change nothing here (``user``, ``parallel_tool_calls``...) are accepted;
fields whose non-default value ragpic cannot honour (``n > 1``, ``logprobs``, ``tools`` unless
``tool_choice: "none"``, penalties) are refused, never silently ignored. Messages quote at
most ~100 characters of what was sent (:func:`quote`). Extension fields: ``cache_ids`` (ids
from ``POST /v1/context_cache``), ``hints`` (chunk texts expected in the prompt), ``method``
(a link method for this request) and ``top_k``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ragpic.errors import BadRequest  # importable from here too

__all__ = ["BadRequest", "Parsed", "parse_body", "quote"]

_REFUSED_UNLESS_DEFAULT = {"logprobs": (None, False), "top_logprobs": (None, 0), "functions": (None, []),
                           "function_call": (None, "none"),
                           "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
                           "repetition_penalty": (None, 1, 1.0),
                           "logit_bias": (None, {}), "best_of": (None, 1), "echo": (None, False),
                           "suffix": (None, ""), "response_format": (None, {"type": "text"})}
ROLES = ("system", "developer", "user", "assistant")  # tool turns need tools, which are refused
MAX_STOPS = 4  # OpenAI's limit on stop sequences
SEED_MAX = 2 ** 63 - 1  # OpenAI's seed is an int64; the engine's generator takes a non-negative one
MAX_TOKENS_CAP = 2 ** 31  # past any model's window; bounds what reaches the engine's arithmetic


def quote(value: object, limit: int = 100) -> str:
    """``repr(value)`` cut to ``limit`` characters: errors never echo a 100 KB field back."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


@dataclass(slots=True)
class Parsed:
    """A checked completion request (before cache ids are resolved).

    ``max_tokens_field``: the name the client used for the token limit (errors name it)."""

    model: str
    stream: bool
    include_usage: bool
    messages: list[dict] | None
    prompt: str | None
    sampling: dict
    method: str | None
    cache_ids: list[str]
    hints: list[str]
    max_tokens_field: str = "max_tokens"


def _field(body: dict, name: str, kinds: tuple[type, ...], what: str):
    value = body.get(name)
    if value is not None and (not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds):
        raise BadRequest(f"{name} must be {what}, got {type(value).__name__} {quote(value, 40)}", param=name)
    return value


def _number(body: dict, name: str, low: float, high: float, what: str):
    value = _field(body, name, (int, float), what)
    if value is not None and not (math.isfinite(value) and low <= value <= high):
        raise BadRequest(f"{name} must be {what}, got {quote(value, 40)}", param=name)
    return value


def _int(body: dict, name: str, low: int, high: int, what: str):
    value = _field(body, name, (int,), what)
    if value is not None and not low <= value <= high:
        raise BadRequest(f"{name} must be {what}, got {quote(value, 40)}", param=name)
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
        if m["role"] not in ROLES:
            raise BadRequest(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {quote(m['role'], 40)}",
                             param=f"messages[{i}].role")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]: text parts only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise BadRequest(f"messages[{i}].content: only text parts are supported", param=f"messages[{i}]")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string", param=f"messages[{i}].content")
        # the chat template knows system turns; OpenAI's developer role is the same instruction turn
        out.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
    return out


def _prompt(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("prompt must be a non-empty string (one prompt per request)", param="prompt")
    return prompt


def _token_limit(body: dict, name: str) -> int:
    """``body[name]`` checked: an integer >= 1 and at most :data:`MAX_TOKENS_CAP` (each its own
    message: a huge valid integer is not told it is below 1)."""
    value = _int(body, name, 1, float("inf"), "an integer >= 1")
    if value > MAX_TOKENS_CAP:  # the model's window is checked later, with the prompt's length
        raise BadRequest(f"{name} {value} is more than any context window this server can hold "
                         f"({MAX_TOKENS_CAP} tokens): ask for at most the model's context window minus the "
                         f"prompt's tokens", param=name, code="context_length_exceeded")
    return value


def _max_tokens(body: dict) -> tuple[int | None, str]:
    """The token limit and the field it came from; both fields and different: refused."""
    given = {name: _token_limit(body, name)
             for name in ("max_tokens", "max_completion_tokens") if body.get(name) is not None}
    if len(set(given.values())) > 1:
        raise BadRequest(f"max_tokens ({given['max_tokens']}) and max_completion_tokens "
                         f"({given['max_completion_tokens']}) disagree: send one of them", param="max_tokens")
    field = next(iter(given), "max_tokens")
    return given.get(field), field


def _sampling(body: dict) -> tuple[dict, str]:
    max_tokens, field = _max_tokens(body)
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)):
        raise BadRequest("stop must be a string or a list of non-empty strings", param="stop")
    if stop is not None and len(stop) > MAX_STOPS:
        raise BadRequest(f"stop holds at most {MAX_STOPS} strings, got {len(stop)}", param="stop")
    out = {"max_new_tokens": max_tokens,
           "temperature": _number(body, "temperature", 0, 2, "a number from 0 to 2"),
           "top_p": _number(body, "top_p", 0, 1, "a number from 0 to 1"),
           "top_k": _int(body, "top_k", 0, 2 ** 31, "an integer >= 0 (0: no limit)"),
           "seed": _int(body, "seed", 0, SEED_MAX, f"an integer from 0 to {SEED_MAX}"),
           "stop": tuple(stop) if stop else None}
    if out["top_p"] == 0:  # OpenAI's 0 keeps the likeliest token only: top_k=1 is exactly that
        out["top_p"], out["top_k"] = None, 1
    return {k: v for k, v in out.items() if v is not None}, field


def _tools(body: dict) -> None:
    """``tools`` only with ``tool_choice: "none"`` (do not call them); no tools: any choice but a call."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools not in (None, []) and choice != "none":
        raise BadRequest("tools are not supported by ragpic serve (send tool_choice: \"none\" to answer "
                         "without calling them)", param="tools")
    if choice not in (None, "none", "auto"):
        raise BadRequest(f"tool_choice={quote(choice, 40)} is not supported by ragpic serve", param="tool_choice")


def parse_body(body: object, *, chat: bool) -> Parsed:
    """Check a decoded JSON body of ``/v1/chat/completions`` (``chat``) or ``/v1/completions``."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model is required: a model id from GET /v1/models", param="model")
    n = _int(body, "n", 1, 1, "1: ragpic generates one choice per request")
    del n
    for name, defaults in _REFUSED_UNLESS_DEFAULT.items():
        if name in body and body[name] not in defaults:
            raise BadRequest(f"{name}={quote(body[name], 40)} is not supported by ragpic serve", param=name)
    _tools(body)
    stream = bool(_field(body, "stream", (bool,), "true or false"))
    options = _field(body, "stream_options", (dict,), "an object such as {\"include_usage\": true}")
    if options is not None and not stream:
        raise BadRequest("stream_options is only allowed when stream is true", param="stream_options")
    method = _field(body, "method", (str,), "a link method name (legolink-16, naive, full...)")
    if method is not None and len(method) > 64:
        raise BadRequest(f"method {quote(method, 40)} is not a link method name", param="method")
    sampling, field = _sampling(body)
    return Parsed(model=model, stream=stream, include_usage=bool(options and options.get("include_usage")),
                  messages=_messages(body) if chat else None, prompt=None if chat else _prompt(body),
                  sampling=sampling, method=method, cache_ids=_strings(body, "cache_ids"),
                  hints=_strings(body, "hints"), max_tokens_field=field)
