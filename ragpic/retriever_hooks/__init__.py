"""Framework hooks that compile chunk KV at ingest and pass retrieval hints to the LLM.

One module per framework (``ragpic.retriever_hooks.llamaindex``, ...). This package imports
nothing itself, so ``import ragpic`` never pulls in a framework.
"""
