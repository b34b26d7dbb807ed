"""The PIC engine core: model facts, compile, link, decode. It imports no framework and
nothing from ``ragpic.engine``, ``ragpic.llm``, ``ragpic.retriever_hooks`` or ``ragpic.eval``.

Modules, in data-path order (docs/ARCHITECTURE.md §2):

- :mod:`~ragpic.core.methods`: link method and compile recipe names (no torch).
- :mod:`~ragpic.core.model` (load, check, wrap: the :class:`~ragpic.core.model.LoadedModel`
  record), :mod:`~ragpic.core.fingerprint` (whose KV an entry is),
  :mod:`~ragpic.core.default_model` (the embedded SmolLM2).
- :mod:`~ragpic.core.segments`: prompt text -> cached chunks found -> segments.
- :mod:`~ragpic.core.compile`: segments -> :class:`~ragpic.core.kv.ChunkKV`;
  :mod:`~ragpic.core.kv` holds it, its int8 decode and its keys' re-rotation.
- :mod:`~ragpic.core.link`: one strategy per method (:mod:`~ragpic.core.link.rows`,
  :mod:`~ragpic.core.link.cacheblend`, :mod:`~ragpic.core.link.query_guided`), the plan
  (:mod:`~ragpic.core.link.plan`) and the run, whole or in pieces (:mod:`~ragpic.core.link.pieces`).
- :mod:`~ragpic.core.forward`: the one forward step every model call over a linked cache takes.
- :mod:`~ragpic.core.decode`: cache -> tokens -> text; :mod:`~ragpic.core.batch`: one decode
  step for several requests at once (``ragpic serve``).

:mod:`ragpic.core.ops` holds the tensor layer underneath. This package imports nothing on import.
"""
