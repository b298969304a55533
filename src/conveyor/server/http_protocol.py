"""uvicorn's HTTP protocol with a deadline on reading a request's head.

uvicorn closes a keep-alive connection that stays silent, but a client that sends a byte now and then
(or a header line every few seconds) keeps a connection, and its socket and buffers, for as long as it
likes: a thousand such clients held a server's connections for 20 s. Here a connection must deliver a
whole request head within `header_timeout_s` of connecting, or of its previous answer; otherwise it is
closed. The body is not under this deadline (bodies are bounded by size, `conveyor.http.inputs`).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` that closes a connection whose request head does not arrive in time."""

    header_timeout_s: float = 10.0
    _head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._disarm_head_deadline()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_deadline()  # the next request's head is due in time too

    def _arm_head_deadline(self) -> None:
        self._disarm_head_deadline()
        self._head_deadline = self.loop.call_later(self.header_timeout_s, self._head_too_late)

    def _disarm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_late(self) -> None:
        self._head_deadline = None
        if not self.transport.is_closing():
            self.transport.close()


def header_deadline_protocol(timeout_s: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class to give uvicorn (`http=`), with its deadline."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout_s": timeout_s})
