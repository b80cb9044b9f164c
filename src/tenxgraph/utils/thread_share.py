"""Who may hold the executor's threads, and the threads nobody waits for any more.

Sync tools and nodes run in the event loop's executor (:func:`tenxgraph.utils.sync.to_thread_in`). On a server
one owner's slow sync tools could take every thread and delay every other owner's; so a request's run carries
its owner's :class:`ThreadShare` (the run config's ``thread_share``, which only the server sets): at most its
``size`` threads at once, each counted **until its thread ends**, not until its caller stops waiting (a sync
tool cut by its timeout keeps its thread: Python cannot stop it). Such a thread, still running after its call
was abandoned, is counted (:func:`outliving_threads`) and reported with a WARNING when it starts to outlive it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from tenxgraph.utils.constants import LOGGER_NAME

log = logging.getLogger(LOGGER_NAME)


class ThreadShare:
    """At most *size* executor threads at once for one owner's calls (on the loop that serves them)."""

    def __init__(self, owner: str, size: int) -> None:
        if size < 1:
            raise ValueError(f"a thread share must be 1 or more threads, got {size!r}")
        self.owner, self.size = owner, size
        self._slots: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}

    async def acquire(self) -> Callable[[], None]:
        """Wait for a thread of the share; the function that gives it back, from any thread, once."""
        loop = asyncio.get_running_loop()
        slots = self._slots.setdefault(loop, asyncio.Semaphore(self.size))
        await slots.acquire()
        given_back = threading.Event()

        def release() -> None:
            if not given_back.is_set():
                given_back.set()
                loop.call_soon_threadsafe(slots.release)

        return release


_outliving_lock = threading.Lock()
_outliving = 0


def outliving_threads() -> int:
    """Threads still running a sync call whose caller stopped waiting (its timeout, its run's end)."""
    return _outliving


def began_outliving(name: str) -> None:
    global _outliving
    with _outliving_lock:
        _outliving += 1
        now = _outliving
    log.warning(
        "sync call %s outlived its caller (a timeout or the run's end) and keeps its thread until it returns: "
        "%d such thread(s) now; give it a timeout of its own (a client's, a socket's)", name, now,
    )  # fmt: skip


def ended_outliving() -> None:
    global _outliving
    with _outliving_lock:
        _outliving -= 1
