"""``ragpic serve``: an OpenAI-compatible server over one :class:`ragpic.RagPic` engine.

Modules: :mod:`.cli` (the command), :mod:`.app` (the FastAPI app), :mod:`.completions`
(the completion routes' logic), :mod:`.bodies`
(OpenAI request bodies, checked), :mod:`.job` (a request on its way through the scheduler
and the events it sends back), :mod:`.responses`
(OpenAI response bodies, SSE, JSON errors), :mod:`.scheduler` and :mod:`.running` (the thread that owns
the model: links requests between batched decode steps), :mod:`.detok` (token ids
-> text deltas, pushed one id at a time), :mod:`.metrics` (Prometheus text),
:mod:`.context_cache` (EPIC's explicit cache API). An adapter: it may import the engine,
core, cache, config, errors and generation; nothing in ragpic imports it.
"""
