"""Deadlines for a request's headers and for a client's reading, on uvicorn's own HTTP protocol (h11, or
httptools where installed).

uvicorn waits for the headers of a request for ever: a client that sends one header line a minute (slowloris)
holds a connection, and 300 such clients held 300 (#32). Each connection here gets ``header_timeout`` seconds
from its first byte of a request (or from the connection's start) until uvicorn has that request's headers and
starts serving it; past it, the connection is closed. The body has its own limit (``--body-timeout``, in the
app)."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

Base: Any = AutoHTTPProtocol


class HeaderDeadline(Base):  # type: ignore[misc]
    """The header deadline, and a write deadline: when the transport's buffer is full (the client is not reading
    what it asked for), the client has ``write_timeout`` seconds to read some of it before the connection is
    cut (uvicorn waits for ever: 5 clients reading a 5 MB state at 4 KB held 5 connections past every timeout)."""

    def __init__(self, *args: Any, header_timeout: float = 10.0, write_timeout: float = 30.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout, self.write_timeout = header_timeout, write_timeout
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for: Any = None  # the cycle that was current when the deadline was armed
        self._stalled: asyncio.TimerHandle | None = None  # the write deadline, while the buffer is full

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stalled is None:
            self._stalled = self.loop.call_later(self.write_timeout, self._cut)

    def resume_writing(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
        super().resume_writing()

    def _cut(self) -> None:
        self._stalled = None
        if not self.transport.is_closing():
            self.transport.abort()  # (what it did not read is dropped; its request's handler sees a disconnect)

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the first bytes of a next request on a kept-alive connection
        super().data_received(data)
        if self._deadline is not None and self.cycle is not self._waiting_for:
            self._deadline.cancel()  # its headers are in: the request is being served
            self._deadline = None

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._deadline, self._stalled):
            if timer is not None:
                timer.cancel()
        self._deadline = self._stalled = None
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._waiting_for = self.cycle
        self._deadline = self.loop.call_later(self.header_timeout, self._expired)

    def _expired(self) -> None:
        self._deadline = None
        if self.cycle is self._waiting_for and not self.transport.is_closing():
            self.transport.close()
