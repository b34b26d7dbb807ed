"""One completion request on its way through the scheduler, and the events it sends back.

The HTTP handler (on the event loop) makes a :class:`GenJob` and awaits its events; the
scheduler thread (which owns the model) sends them with :meth:`GenJob.send`, which hands each
to the loop thread-safely. Events, in order: :class:`Linked` once the prompt is linked (or
:class:`Failed` instead), then a :class:`Delta` per text piece, then :class:`Done` (or
:class:`Failed`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from ragpic.core.methods import Method
from ragpic.engine.generation import Generation

__all__ = ["Delta", "Done", "Event", "Failed", "GenJob", "Linked"]


@dataclass(frozen=True, slots=True)
class Linked:
    """The prompt is linked: the :class:`Generation` so far (counts, ``link_s``)."""

    generation: Generation


@dataclass(frozen=True, slots=True)
class Delta:
    """The next piece of the answer's text."""

    text: str


@dataclass(frozen=True, slots=True)
class Done:
    """The answer is complete (``generation.finish_reason`` says why)."""

    generation: Generation


@dataclass(frozen=True, slots=True)
class Failed:
    """The request ended with ``error`` (a bad request, a failure, a shutdown, a client gone)."""

    error: BaseException


Event = Linked | Delta | Done | Failed


@dataclass(slots=True)
class GenJob:
    """What to generate and where to send the events.

    Attributes:
        messages: chat messages (``/v1/chat/completions``), or None.
        prompt: raw prompt text (``/v1/completions``: no chat template), or None.
        sampling: ``RagPic.sampling`` overrides (``max_new_tokens``, ``temperature``...).
        method: link method for this request, parsed by the body's reader (None: the server's).
        hints: chunk texts expected in the prompt (from ``cache_ids`` and ``hints``).
        arrived: ``time.perf_counter()`` when the request arrived (TTFT is measured from it).
    """

    messages: list[dict] | None
    prompt: str | None
    sampling: dict
    method: Method | None = None
    hints: list[str] | None = None
    arrived: float = field(default_factory=time.perf_counter)
    loop: asyncio.AbstractEventLoop | None = None
    events: asyncio.Queue | None = None
    cancelled: bool = False  # set by the handler (client gone, stop): the scheduler drops the job
    tenant: object | None = None  # the caller's namespace view (tenants.Namespace: owns, note), or None
    plan: object | None = None  # set once matched: its running.Running, not linked yet (the scheduler may admit it)

    def bind(self) -> "GenJob":
        """Attach to the running event loop (call from the handler)."""
        self.loop = asyncio.get_running_loop()
        self.events = asyncio.Queue()
        return self

    def send(self, event: Event) -> None:
        """From any thread: queue one event for the handler (dropped if its loop is gone)."""
        if self.loop is None or self.events is None:
            return
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop closed (server shutting down)
            pass

    async def next_event(self) -> Event:
        assert self.events is not None, "GenJob.bind() first"
        return await self.events.get()
