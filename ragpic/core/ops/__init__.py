"""Tensor-level pieces under link and decode; they import nothing else from ragpic.

:mod:`.attention` (attention plans: bands and their masks, one SDPA over grouped K/V, and
ragpic's registered attention function), :mod:`.key_blocks` (the CPU's one pass per key
block), :mod:`.attention_probe` (what the question attends to, for ``qr`` and ``qp``),
:mod:`.linked_cache` (the row-write KV cache and the pool that reuses its memory) and
:mod:`.device` (the host <-> device boundary and default dtypes)."""
