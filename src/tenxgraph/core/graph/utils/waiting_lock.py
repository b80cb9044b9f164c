"""A named lock of the ledger's store that an integration waits for: :func:`waiting_lock`. The store's own run
lock (``arun_lock``: a PostgreSQL advisory lock, a byte of SQLite's lock file; released when its process dies),
taken under a name of the integration's (a LangGraph step that k processes resume at once, a Pydantic AI run),
waited for while another process holds it."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from tenxgraph.storage.ledger_store import LedgerStore
from tenxgraph.utils.constants import LOGGER_NAME
from tenxgraph.utils.errors import ThreadBusyError

__all__ = ["waiting_lock"]
log = logging.getLogger(LOGGER_NAME)
_lockless_warned: set[str] = set()

#: Within a process, the holders of one name take it in turn (an asyncio lock per event loop and name), so a
#: process holds one storage lock per name, never one per caller: a PostgreSQL lock holds a pool connection, and
#: more callers than the pool has connections, each waiting to record while holding one, would stall.
_in_process: weakref.WeakValueDictionary[tuple[int, str], asyncio.Lock] = weakref.WeakValueDictionary()


@asynccontextmanager
async def waiting_lock(ledger: LedgerStore, name: str, thread_id: str, wait: float, what: str) -> AsyncIterator[None]:
    """Hold *ledger*'s run lock named *name* (a thread id by the store's rules), waiting up to *wait* seconds
    while another holder has it (then :class:`ThreadBusyError` for *thread_id*). A store without ``arun_lock`` has
    none across processes: a WARNING naming *what* would run more than once, once per store type."""
    key = (id(asyncio.get_running_loop()), name)
    local = _in_process.get(key)
    if local is None:
        local = _in_process[key] = asyncio.Lock()
    async with local:
        take: Callable[[str], Any] | None = getattr(ledger, "arun_lock", None)
        if take is None:
            kind = type(ledger).__name__
            if kind not in _lockless_warned:
                _lockless_warned.add(kind)
                log.warning(
                    "the %s ledger has no arun_lock: processes that resume %s at once may each run it "
                    "(use SqliteCheckpointer or PgCheckpointer)", kind, what,
                )  # fmt: skip
            yield
            return
        start, delay = time.monotonic(), 0.005
        async with AsyncExitStack() as stack:
            while True:
                try:
                    await stack.enter_async_context(take(name))
                    break
                except ThreadBusyError:
                    waited = time.monotonic() - start
                    if waited > wait:
                        raise ThreadBusyError(thread_id, waited=round(waited, 1)) from None
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 0.2)
            yield
