"""Tensor-level pieces under link: RoPE re-rotation (:mod:`.rope`), banded GQA attention and
masks (:mod:`.attention`; :mod:`.attention_probe` records what the question attends to), the
row-write KV cache (:mod:`.linked_cache`) and the pool that reuses its memory
(:mod:`.slab_pool`). They import nothing else from ragpic."""
