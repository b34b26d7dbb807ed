"""Redis and Redis Cluster as a store backend: :mod:`.backend` (``RedisBackend``: entries and the
transaction that writes a catalog row with its entry), :mod:`.catalog` (``key -> chunk text``),
:mod:`.text` (the catalog's anchor rows) and :mod:`.inspect` (what ``ragpic store check`` and
``stats`` read). Nothing is imported here: redis-py is an optional dependency."""
