"""``ragpic serve``: an OpenAI-compatible server over one :class:`ragpic.RagPic` engine.

Modules: :mod:`.cli` (the command), :mod:`.app` (the FastAPI routes), :mod:`.requests`
(OpenAI request bodies -> checked :class:`~.requests.GenRequest`), :mod:`.responses`
(OpenAI response bodies, SSE, JSON errors), :mod:`.scheduler` (the thread that owns the
model: admits and links requests between batched decode steps), :mod:`.detok` (token ids
-> text deltas, pushed one id at a time), :mod:`.metrics` (Prometheus text),
:mod:`.context_cache` (EPIC's explicit cache API). An adapter: it may import the engine,
core, cache, config, errors and generation; nothing in ragpic imports it.
"""
