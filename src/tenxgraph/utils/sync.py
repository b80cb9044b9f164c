"""Sync wrappers over the async core.

Every sync entry point (``CompiledGraph.invoke``, ``checkpointer.get_thread`` ...) runs its coroutine on one
event loop per process (:class:`SyncLoop`). One loop (rather than ``asyncio.run`` per call) matters for resources
bound to a loop, such as a psycopg connection pool: opened through a sync call, it is always used on the same loop.

Who runs that loop: the calling thread itself, when nobody else is running it (no hop to another thread and back,
about 0.1 ms a call); else the call is handed to the loop where it runs and waits for its
result. Whatever is left on the loop when a caller's coroutine is done (a stream's producer, a connection pool's
tasks, a call another thread handed over meanwhile) is run on by a helper thread until nothing is, so the loop
never stops with work on it. The loop is recreated in a forked child, whose copy of the parent's threads does not
exist.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from tenxgraph.utils.constants import LOGGER_NAME
from tenxgraph.utils.thread_share import ThreadShare, began_outliving, ended_outliving

T = TypeVar("T")

#: How often the helper thread looks whether the loop has anything left to run (then lets callers run it again).
IDLE_CHECK_S = 0.05

log = logging.getLogger(LOGGER_NAME)


class SyncLoop:
    """The sync wrappers' event loop, run by whichever thread needs it: a caller when the loop is free (in its own
    thread, one call at a time), else the thread running it (a caller, or the helper). ``driver`` is the thread
    running it now (its ident; None: nobody); ``handed`` counts calls handed to it by other threads, not yet
    returned to their callers.

    A call made by the driver itself between its own steps (a sync generator's ``finally`` run by the garbage
    collector, say) runs the loop there and then: handing it over would wait for itself."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.guard = threading.RLock()  # (re-entered by such a call made while it is held)
        self.help_wanted = threading.Condition(self.guard)
        self.driver: int | None = None
        self.handed = 0
        self.helper: threading.Thread | None = None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        me = threading.get_ident()
        with self.guard:
            nested = self.driver == me  # (the loop is not running here: run_sync refused a call from inside it)
            own = self.driver is None
            if own:
                self.driver = me
            elif not nested:
                self.handed += 1
        if not (own or nested):
            try:
                return asyncio.run_coroutine_threadsafe(coro, self.loop).result()
            finally:
                with self.guard:
                    self.handed -= 1
        try:
            return self.loop.run_until_complete(self.loop.create_task(coro))  # (the caller's context, as handed over)
        finally:
            if own:  # (a nested call leaves the loop to the step of this thread's that it interrupted)
                with self.guard:
                    if self.handed or self._work_left():
                        self._call_helper()
                    else:
                        self.driver = None

    def _work_left(self, running: asyncio.Task[Any] | None = None) -> bool:
        """A task other than *running* is not done (read while no thread runs the loop, or from inside it)."""
        return any(task is not running and not task.done() for task in asyncio.all_tasks(self.loop))

    def _call_helper(self) -> None:
        """(Under the guard.) The helper runs the loop on from here."""
        if self.helper is None:
            self.helper = threading.Thread(target=self._help, name="tenxgraph-sync", daemon=True)
            self.helper.start()
        self.driver = self.helper.ident
        self.help_wanted.notify()

    def _help(self) -> None:
        me = threading.get_ident()
        idle: asyncio.Task[None] | None = None
        while True:
            with self.guard:
                while self.driver != me:
                    self.help_wanted.wait()
            while True:
                if idle is None or idle.done():
                    idle = self.loop.create_task(self._until_idle())
                try:
                    self.loop.run_until_complete(idle)
                except BaseException:  # (a task's SystemExit leaves the loop too; its awaiter has it: run on)
                    log.exception("the sync wrappers' helper thread: an exception left the event loop")
                with self.guard:  # (looked at again once the loop has stopped: a caller may run it from here on)
                    if not self.handed and not self._work_left():
                        self.driver = None
                        break

    async def _until_idle(self) -> None:
        me = asyncio.current_task()
        while True:
            with self.guard:
                if not self.handed and not self._work_left(me):
                    return
            await asyncio.sleep(IDLE_CHECK_S)


_lock = threading.Lock()
_sync: SyncLoop | None = None


def _current() -> SyncLoop:
    global _sync
    sync = _sync
    if sync is not None and not sync.loop.is_closed():
        return sync
    with _lock:
        if _sync is None or _sync.loop.is_closed():
            _sync = SyncLoop()
        return _sync


#: The parent's loops, in a forked child: kept, never closed nor collected. Closing one (as its ``__del__`` would)
#: unregisters its self-pipe from its epoll instance, which the child shares with the parent: the parent's loop
#: would then sleep through every wake-up from another thread.
_inherited: list[SyncLoop] = []


def _forget_loop_after_fork() -> None:
    global _sync, _lock, _idle
    if _sync is not None:
        _inherited.append(_sync)
    _sync = None
    _lock = threading.Lock()
    _busy.clear()  # the parent's worker threads do not exist here
    _idle = threading.Condition()


os.register_at_fork(after_in_child=_forget_loop_after_fork)

#: One item per thread inside :func:`to_thread`'s call (appending and popping a list are atomic: a call costs no
#: lock of its own); :func:`wait_threads_idle`, rare (the harness before it forks), is woken through ``_idle``.
_busy: list[None] = []
_waiters: list[None] = []
_idle = threading.Condition()
_worker = threading.local()  # .loop: the event loop whose to_thread call the current thread is running


class _Handed:
    """One :func:`to_thread` call, counted from the moment it is handed to the executor: it either begins in its
    thread or is abandoned (cancelled before it began), never both; a begun one either finishes while its caller
    waits, or outlives its caller (cancelled while it ran) and then finishes."""

    __slots__ = ("lock", "state")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.state = "handed"

    def mark(self, to: str, was: str = "handed") -> bool:
        """Move from *was* to *to*; False (and nothing changes) if the call is not in *was*."""
        with self.lock:
            if self.state != was:
                return False
            self.state = to
            return True


async def to_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """:func:`to_thread_in` no share of threads of its own."""
    return await to_thread_in(None, fn, *args, **kwargs)


async def to_thread_in(share: ThreadShare | None, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``asyncio.to_thread`` for sync tools and nodes, counting threads that are running them (from the moment a
    call is handed to the executor: one whose thread has not started yet counts too).

    A cancelled call's thread cannot be stopped and keeps running; :func:`wait_threads_idle` lets a caller
    (the crash-matrix harness before it forks) wait until no such thread is inside user code or a driver.
    *share*: the run's owner's share of the threads (a server's), held until the thread ends."""
    loop = asyncio.get_running_loop()
    release = await share.acquire() if share is not None else None  # (a server: the owner's share of threads)
    handed = _Handed()
    _busy.append(None)

    def counted() -> T:
        if not handed.mark("begun"):  # cancelled before it began: it never runs
            raise asyncio.CancelledError
        _worker.loop = loop
        try:
            return fn(*args, **kwargs)
        finally:
            _worker.loop = None
            _done()
            if release is not None:
                release()  # (its thread is free only now: a call cut by its timeout kept it till here)
            if handed.mark("finished", was="outliving"):
                ended_outliving()
            else:
                handed.mark("finished", was="begun")

    try:
        return await asyncio.to_thread(counted)
    except BaseException:
        if handed.mark("abandoned"):
            _done()
            if release is not None:
                release()
        elif handed.mark("outliving", was="begun"):  # its caller stops waiting; its thread runs on
            began_outliving(getattr(fn, "__qualname__", repr(fn)))
        raise


def _done() -> None:
    _busy.pop()
    if _waiters:
        with _idle:
            _idle.notify_all()


def calling_loop() -> asyncio.AbstractEventLoop | None:
    """Inside a :func:`to_thread` call: the event loop that made it (the harness's crash in a tool body uses it
    to let the loop catch up first); else None."""
    return getattr(_worker, "loop", None)


def wait_threads_idle(timeout: float, leave: int = 0) -> bool:
    """Wait until no thread started by :func:`to_thread` is running (at most *leave*: 1 from inside such a
    call, which counts itself); False if *timeout* seconds passed first."""
    deadline = time.monotonic() + timeout
    _waiters.append(None)
    try:
        with _idle:
            while len(_busy) > leave:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                _idle.wait(min(left, 0.01))  # (a thread that finished before we waited is seen 10 ms later)
    finally:
        _waiters.pop()
    return True


def sync_loop() -> asyncio.AbstractEventLoop:
    """The loop the sync wrappers use (made on first use)."""
    return _current().loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run *coro* to completion on the sync wrappers' loop (see :class:`SyncLoop`) and return its result (or raise
    its exception)."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    sync = _current()
    if running is sync.loop:
        coro.close()
        raise RuntimeError("a sync tenxgraph method was called from inside its own loop; await the a* method")
    if running is not None:
        coro.close()
        raise RuntimeError(
            "a sync tenxgraph method was called from inside a running event loop, which it would block; "
            "await the async variant instead (ainvoke, aget_thread, ...)"
        )
    return sync.run(coro)


async def on_sync_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Await *coro* on the sync wrappers' loop from any other loop (on that loop itself: awaited there). For a store
    whose connections belong to the loop that opened them (``PgCheckpointer``), used from a framework's own loop:
    its connections stay on one loop, the one its sync methods (``close``) use. (A worker thread runs it there as
    a sync call does: the loop has no thread of its own to hand it to.)"""
    home = _current()
    if asyncio.get_running_loop() is home.loop:
        return await coro
    try:
        return await asyncio.to_thread(home.run, coro)
    except BaseException:
        if inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:  # cancelled before the thread began it
            coro.close()  # (closed: not warned of as a coroutine never awaited)
        raise
