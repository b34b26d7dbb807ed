"""The process around the app: uvicorn with a header timeout and a graceful shutdown.

- **Header timeout**: uvicorn's h11 protocol waits for request headers forever (its
  keep-alive timeout only runs between requests); :func:`protocol_with_header_timeout`
  closes a connection whose headers are not complete ``header_timeout`` seconds after it
  opened or after its last response. Body reads are bounded in :mod:`.reading`.
- **Shutdown grace** (:class:`GracefulServer`): the first SIGTERM/SIGINT keeps the port open
  and drains: new requests (and ``/health``: balancers stop sending) get a JSON 503 with
  ``Retry-After``, running and waiting ones go on for up to ``grace`` seconds; what is still
  there then ends cleanly (an SSE error event and ``[DONE]``, or a JSON 503), and only then
  does uvicorn close the connections. A second signal stops at once (uvicorn's own handling).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ragpic.serve.scheduler import Scheduler, ShuttingDown

__all__ = ["GracefulServer", "protocol_with_header_timeout"]

log = logging.getLogger("ragpic.serve")
CLOSE_WAIT_S = 5.0  # after the grace: time for the aborted handlers to write their last bytes


def protocol_with_header_timeout(header_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing connections whose request headers take too long."""

    class HeaderTimeoutH11(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            super().data_received(data)
            if self.cycle is not cycle:  # a request's headers were parsed
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderTimeoutH11


class GracefulServer(uvicorn.Server):
    """uvicorn's server with a drain of ``grace`` seconds before it closes anything.

    ``drain``: called once at the first signal to refuse new work (default ``scheduler.drain``;
    ``ragpic serve`` passes the app's ``app.state.drain``, which also turns ``/health`` to 503)."""

    def __init__(self, config: uvicorn.Config, scheduler: Scheduler, grace: float,
                 drain: Callable[[], None] | None = None):
        super().__init__(config)
        self.scheduler, self.grace = scheduler, grace
        self.drain = drain or scheduler.drain
        self._draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()  # signal handlers run outside it: they post to it
        await super().serve(sockets)

    def handle_exit(self, sig, frame) -> None:
        if self._draining or self._loop is None:  # a second signal (or not serving yet): stop now
            return super().handle_exit(sig, frame)
        self._draining = True
        self.drain()
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = self._loop.create_task(self._drain())  # held: the loop keeps tasks weakly

    async def _drain(self) -> None:
        log.warning("shutting down: new requests get 503, running ones have %g s", self.grace)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace
        while not self.scheduler.idle and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if not self.scheduler.idle:
            self.scheduler.abort(ShuttingDown(f"the server shut down before this request finished "
                                              f"(--shutdown-grace {self.grace:g} s): retry"))
            end = loop.time() + CLOSE_WAIT_S
            while not self.scheduler.idle and loop.time() < end:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # the handlers write their last events
        self.should_exit = True
