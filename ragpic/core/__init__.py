"""The PIC engine core: model facts, compile, link, decode. It imports no framework and
nothing from ``ragpic.engine``, ``ragpic.llm``, ``ragpic.retriever_hooks`` or ``ragpic.eval``.

Modules, in data-path order: :mod:`~ragpic.core.methods` (method and recipe names),
:mod:`~ragpic.core.model` (load, check, fingerprint), :mod:`~ragpic.core.segments` and
:mod:`~ragpic.core.segments` (text -> segments), :mod:`~ragpic.core.compile` (segments ->
:class:`~ragpic.core.kv.ChunkKV`), :mod:`~ragpic.core.link` (+ :mod:`~ragpic.core.link.cacheblend`,
:mod:`~ragpic.core.link.query_guided`),
:mod:`~ragpic.core.decode` and :mod:`~ragpic.core.text_stream` (cache -> tokens -> text).
:mod:`ragpic.core.ops` holds the tensor layer underneath: RoPE re-rotation, banded attention,
the row-write cache and its memory pool. This package imports nothing on import.
"""
