"""A connection to one MCP server (stdio command, or streamable HTTP URL) through the official ``mcp`` SDK.

The SDK's session lives in a task group on one event loop; our runs happen on any loop (``invoke`` has its own,
``ainvoke`` the caller's), and the crash harness forks. So the session runs in a thread of its own with its own
loop, opened on first use and kept for the life of the app: calls from any loop are handed to it and awaited. A
forked child does not touch its parent's session (its pipes, its thread): it opens its own on first use. A server
that exits is noticed at the next call, which reconnects once; a call the server exits during is answered with
:class:`~tenxgraph.utils.errors.ToolUnavailableError` (nothing is recorded: its outcome is unknown).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, TextIO, cast

from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from tenxgraph.utils.errors import ConfigError, ToolUnavailableError
from tenxgraph.utils.sync import run_sync

#: The MCP error code of a connection that closed (the server exited, or the stream broke).
CONNECTION_CLOSED = types.CONNECTION_CLOSED
Opener = Callable[[TextIO], AbstractAsyncContextManager[Any]]


class MCPSession:
    """One MCP server, connected on first use and kept open: ``MCPSession.stdio("mcp-server-git", ["--repository",
    path])`` or ``MCPSession.http("http://127.0.0.1:8765/mcp")``. ``close()`` (or ``with``/``async with``) ends it."""

    def __init__(
        self, name: str, opener: Opener, where: str, *, connect_timeout: float = 30.0, trusted: bool = False
    ) -> None:
        if connect_timeout <= 0:
            raise ConfigError(f"connect_timeout must be > 0 seconds, got {connect_timeout!r}")
        self.name, self.where, self.connect_timeout = name, where, connect_timeout
        #: Whether its tools' annotations set their effect classes. An untrusted server's hints are hints (the
        #: SDK's own docs): a tool claiming ``readOnlyHint`` while it writes would run again; so every call of an
        #: untrusted server's tool is ``external`` unless ``ToolOptions`` says otherwise.
        self.trusted = trusted
        self._opener = opener
        self._guard = threading.Lock()
        self._pid = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: ClientSession | None = None
        self._stop: asyncio.Event | None = None
        self._holder: asyncio.Future[None] | None = None
        self._connecting: asyncio.Lock | None = None  # (on the session's loop: one connect at a time)
        #: The server's tools as last listed (on connecting).
        self.tools: list[types.Tool] = []
        self._printed: list[str] = []  # (the current connection's: what it sent that was not MCP)

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        name: str | None = None,
        connect_timeout: float = 30.0,
        trusted: bool = False,
        inherit_env: bool = False,
    ) -> MCPSession:
        """A server started as a subprocess speaking MCP on its stdin/stdout (its stderr goes to a file of ours:
        its last lines are in the error when it cannot start). *trusted*: its annotations set effect classes.

        Its environment is the SDK's default one (``HOME``, ``PATH``, ``USER`` and a few more: not the agent's
        API keys), plus *env*; ``inherit_env=True`` gives it this process's whole environment (then *env* on top):
        for a server that needs the agent's variables and that you trust with them."""
        given = {**os.environ, **(env or {})} if inherit_env else (dict(env) if env else None)
        params = StdioServerParameters(command=command, args=list(args), env=given, cwd=cwd)
        label = name or os.path.basename(command)
        return cls(label, lambda errlog: stdio_client(params, errlog=errlog), " ".join([command, *args]),
                   connect_timeout=connect_timeout, trusted=trusted)  # fmt: skip

    @classmethod
    def http(
        cls, url: str, *, name: str | None = None, connect_timeout: float = 30.0, trusted: bool = False
    ) -> MCPSession:
        """A server reached over streamable HTTP at *url* (its endpoint, such as ``http://host:port/mcp``).
        *trusted*: its annotations set effect classes."""
        from mcp.client.streamable_http import streamable_http_client

        return cls(name or url, lambda errlog: streamable_http_client(url), url, connect_timeout=connect_timeout,
                   trusted=trusted)  # fmt: skip

    def __repr__(self) -> str:
        return f"MCPSession({self.name!r}: {self.where})"

    # -- lifetime ---------------------------------------------------------------------------------------------
    async def aconnect(self) -> list[types.Tool]:
        """Connect if not connected (or if the server went away, or this process is a fork); the tools."""
        loop = self._start()
        if self._session is None or (self._holder is not None and self._holder.done()):
            future = asyncio.run_coroutine_threadsafe(self._open(), loop)
            try:
                await asyncio.wait_for(asyncio.wrap_future(future), self.connect_timeout)
            except TimeoutError:
                future.cancel()
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._abandon(), loop))
                raise ToolUnavailableError(
                    self._cannot(f"it did not answer within {self.connect_timeout:g}s")
                ) from None
        return self.tools

    def connect(self) -> list[types.Tool]:
        return run_sync(self.aconnect())

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._guard:
            if self._pid != os.getpid():  # (a fork: the parent's thread and pipes are not this process's)
                self._pid, self._loop, self._session, self._holder = os.getpid(), None, None, None
                self._connecting = None
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name=f"mcp-{self.name}", daemon=True).start()
                self._loop = loop
            return self._loop

    async def _open(self) -> None:
        """(On the session's loop.) Start the task that holds the connection, unless a call that came first did;
        wait until it is ready or failed. Calls that find the server gone at once reconnect it once, together."""
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._session is not None and self._holder is not None and not self._holder.done():
                return
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            self._holder = asyncio.ensure_future(self._hold(ready, self._stop))
            await ready

    async def _hold(self, ready: asyncio.Future[None], stop: asyncio.Event) -> None:
        with tempfile.TemporaryFile("w+") as errlog:
            session: ClientSession | None = None
            try:
                printed: list[str] = []  # what the server sent that is not MCP (a banner, a log line on stdout)
                async with (
                    self._opener(errlog) as (read, write),
                    ClientSession(read, write, message_handler=_not_mcp(printed)) as session,
                ):
                    self._printed = printed
                    await session.initialize()
                    self.tools = await _all_tools(session)
                    self._session = session
                    ready.set_result(None)
                    await stop.wait()
            except BaseException as exc:
                if not ready.done():
                    detail = f"{type(exc).__name__}: {_first_error(exc)}{_tail(errlog)}"
                    ready.set_exception(ToolUnavailableError(self._cannot(detail)))
                if not isinstance(exc, Exception):
                    raise
            finally:
                if self._session is session:  # (a newer connection may have replaced this one already)
                    self._session = None

    async def _abandon(self) -> None:
        """(On the session's loop.) End the connection and its server's process now: a call cut off mid-answer
        leaves the stream inside a message (a server still sending would be read for ever, and the next answer
        would be corrupt), and a connect that timed out leaves a server that never answered running. The next
        call reconnects."""
        holder, self._session = self._holder, None
        if self._stop is not None:
            self._stop.set()
        if holder is not None and not holder.done():
            holder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await holder

    def _cannot(self, why: str) -> str:
        said = f"; it sent what is not MCP: {' | '.join(self._printed[-3:])}" if self._printed else ""
        return f"MCP server {self.name!r} ({self.where}) could not be reached: {why}{said}"

    async def aclose(self) -> None:
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._close(), self._start()))
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)

    def close(self) -> None:
        if self._loop is not None and self._pid == os.getpid():
            run_sync(self.aclose())

    async def _close(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._holder is not None and not self._holder.done():  # (an abandoned one was cancelled and awaited)
            with contextlib.suppress(Exception):
                await self._holder

    def __enter__(self) -> MCPSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> MCPSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- calls ------------------------------------------------------------------------------------------------
    async def acall_tool(self, name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> types.CallToolResult:
        """Call *name*. A server that went away since the last call is reconnected first (a ``ping`` tells); one
        that goes away during the call raises :class:`ToolUnavailableError`; an error the server answers with (an
        unknown tool, bad arguments) is returned as an ``is_error`` result."""
        for _ in range(2):
            await self.aconnect()
            assert self._loop is not None
            future = asyncio.run_coroutine_threadsafe(self._call(name, arguments, meta), self._loop)
            try:
                result = await asyncio.wrap_future(future)
            except asyncio.CancelledError:  # (its timeout, or its run's end): the answer may be half read
                future.cancel()
                asyncio.run_coroutine_threadsafe(self._abandon(), self._loop)
                raise
            if result is not None:
                return result
        raise ToolUnavailableError(f"MCP server {self.name!r} ({self.where}) went away again as it was reconnected")

    def _lost(self, session: ClientSession) -> None:
        """(On the session's loop.) The connection closed: forget it (the next call reconnects) and let its holder
        end."""
        if self._session is session:
            self._session = None
        if self._stop is not None:
            self._stop.set()

    async def _call(self, name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> types.CallToolResult | None:
        """The call's result, or None when the server was found gone before anything was sent (reconnect)."""
        session = self._session
        if session is None:
            return None
        try:
            await session.send_ping()  # nothing sent yet: a server gone since the last call is simply reconnected
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise
            self._lost(session)
            return None
        try:
            return await session.call_tool(name, arguments, meta=cast(types.RequestParamsMeta, meta))
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self._lost(session)
                raise ToolUnavailableError(
                    f"MCP server {self.name!r} ({self.where}) went away during the call to {name!r}: its outcome "
                    "is unknown; the next call reconnects"
                ) from exc
            text = f"MCP server {self.name!r} refused the call to {name!r}: {exc.error.message}"
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def _not_mcp(printed: list[str]) -> Any:
    """The SDK's ``message_handler`` for one connection: a line the server sent that is not a JSON-RPC message
    reaches it as an exception; the start of what was sent is kept for the error that names the server."""

    async def handle(message: Any) -> None:
        if isinstance(message, Exception):
            errors_of = getattr(message, "errors", None)  # (pydantic's ValidationError of an unparsable line)
            errors = errors_of() if callable(errors_of) else []
            line = errors[0].get("input") if errors and isinstance(errors[0], dict) else None
            text = repr(line) if isinstance(line, str) else " ".join(str(message).split())
            printed.append(text if len(text) <= 200 else text[:199] + "…")

    return handle


async def _all_tools(session: ClientSession) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor = None
    while True:
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            return tools


def _first_error(exc: BaseException) -> str:
    """The first leaf of an exception group (anyio's task groups wrap what failed)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{exc}" if str(exc) else type(exc).__name__


def _tail(errlog: TextIO, lines: int = 5) -> str:
    with contextlib.suppress(OSError, ValueError):
        errlog.seek(0)
        last = [line.rstrip() for line in errlog.read().splitlines() if line.strip()][-lines:]
        if last:
            return "; its stderr ended with: " + " | ".join(last)
    return ""
