"""Sync wrappers over the async core.

Every sync entry point (``CompiledGraph.invoke``, ``checkpointer.get_thread`` ...) runs its coroutine on one
background event loop per process. One loop (rather than ``asyncio.run`` per call) matters for resources bound
to a loop, such as a psycopg connection pool: opened through a sync call, it is always used on the same loop.
The loop is recreated in a forked child, whose copy of the parent's loop thread does not exist.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _start_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="tenxgraph-sync", daemon=True)
            thread.start()
            _loop = loop
        return _loop


def _forget_loop_after_fork() -> None:
    global _loop, _lock, _idle
    _loop = None
    _lock = threading.Lock()
    _busy.clear()  # the parent's worker threads do not exist here
    _idle = threading.Condition()


os.register_at_fork(after_in_child=_forget_loop_after_fork)

#: One item per thread inside :func:`to_thread`'s call (appending and popping a list are atomic: a call costs no
#: lock of its own); :func:`wait_threads_idle`, rare (the harness before it forks), is woken through ``_idle``.
_busy: list[None] = []
_waiters: list[None] = []
_idle = threading.Condition()


async def to_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``asyncio.to_thread`` for sync tools and nodes, counting threads that are running them.

    A cancelled call's thread cannot be stopped and keeps running; :func:`wait_threads_idle` lets a caller
    (the crash-matrix harness before it forks) wait until no such thread is inside user code or a driver."""

    def counted() -> T:
        _busy.append(None)
        try:
            return fn(*args, **kwargs)
        finally:
            _busy.pop()
            if _waiters:
                with _idle:
                    _idle.notify_all()

    return await asyncio.to_thread(counted)


def wait_threads_idle(timeout: float) -> bool:
    """Wait until no thread started by :func:`to_thread` is running; False if *timeout* seconds passed first."""
    deadline = time.monotonic() + timeout
    _waiters.append(None)
    try:
        with _idle:
            while _busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                _idle.wait(min(left, 0.01))  # (a thread that finished before we waited is seen 10 ms later)
    finally:
        _waiters.pop()
    return True


def sync_loop() -> asyncio.AbstractEventLoop:
    """The background loop the sync wrappers use (started on first use)."""
    return _loop if _loop is not None and not _loop.is_closed() else _start_loop()


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run *coro* to completion on the background loop and return its result (or raise its exception)."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    loop = sync_loop()
    if running is loop:
        coro.close()
        raise RuntimeError("a sync tenxgraph method was called from inside its own loop; await the a* method")
    if running is not None:
        coro.close()
        raise RuntimeError(
            "a sync tenxgraph method was called from inside a running event loop, which it would block; "
            "await the async variant instead (ainvoke, aget_thread, ...)"
        )
    return asyncio.run_coroutine_threadsafe(coro, loop).result()
