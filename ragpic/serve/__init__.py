"""``ragpic serve``: an OpenAI-compatible server over one :class:`ragpic.RagPic` engine.

Modules (the command is :mod:`ragpic.cli.serve`): :mod:`.app` (the FastAPI app), :mod:`.completions`
(the completion routes' logic), :mod:`.bodies`
(OpenAI request bodies, checked), :mod:`.job` (a request on its way through the scheduler
and the events it sends back), :mod:`.responses`
(OpenAI response bodies, SSE, JSON errors), :mod:`.policy` (the scheduler's turn, a pure function),
:mod:`.scheduler`, :mod:`.worker`, :mod:`.running` and :mod:`.compiling` (the thread that owns the model:
link and compile pieces between batched decode steps), :mod:`.tenants` (namespaces; their records in the
store's medium: :mod:`.tenant_records`, :mod:`.tenant_redis`, :mod:`.tenant_sqlite`), :mod:`.detok` (token ids
-> text deltas, pushed one id at a time), :mod:`.metrics` (Prometheus text),
:mod:`.context_cache` (EPIC's explicit cache API), :mod:`.reading` (request bodies: size, time,
JSON depth, Unicode), :mod:`.outcomes` (how a request ends, counted), :mod:`.server` (uvicorn
with a header timeout and a shutdown grace). An adapter: it may import the engine,
core, cache, config, errors and generation; nothing in ragpic imports it.
"""
