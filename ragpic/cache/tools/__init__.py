"""Offline tools over a store: ``check`` / ``check_redis`` (``ragpic store check [--repair]``),
``report`` (``ragpic store stats``); they open backends directly, never a running engine."""
