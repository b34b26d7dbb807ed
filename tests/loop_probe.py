"""Prove an async API leaves the event loop free: count ticks of a task running beside it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def run_with_ticker(work: Callable[[], Awaitable[T]], interval: float = 0.01) -> tuple[T, int]:
    """``await work()`` while a ticker counts how often the loop got to run it; ``(result, ticks)``."""
    ticks = 0
    done = asyncio.Event()

    async def ticker():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(interval)

    t = asyncio.create_task(ticker())
    try:
        return await work(), ticks
    finally:
        done.set()
        await t
