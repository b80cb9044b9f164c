"""``stream(..., stream_mode=...)``: the run in a task of its own, its observer's output handed to the caller.

The run goes on while the caller reads (tokens arrive while a node runs, not only between nodes); what it emits
waits in a queue. A caller that stops reading early cancels the run's task, which releases the thread's run lock
as any cancelled run does (the thread stays resumable); an error or a crash in the run reaches the caller after
what was emitted before it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

from tenxgraph.core.graph.results import StreamEvent
from tenxgraph.core.tools.observe import STREAM_MODES, RunObserver
from tenxgraph.utils.errors import ConfigError

StreamMode = str | Sequence[str]
_DONE = object()


def parse_modes(stream_mode: StreamMode) -> tuple[frozenset[str], bool]:
    """The modes asked for, and whether one was given alone (its chunks then come without the mode's name)."""
    single = isinstance(stream_mode, str)
    modes = [stream_mode] if isinstance(stream_mode, str) else list(stream_mode)
    unknown = [m for m in modes if m not in STREAM_MODES]
    if unknown or not modes:
        raise ConfigError(
            f"stream_mode {stream_mode!r} is not one of {list(STREAM_MODES)} (or a list of them); "
            "e.g. stream_mode='messages' or stream_mode=['updates', 'messages']"
        )
    return frozenset(modes), single


async def stream_run(
    run: Callable[[RunObserver], AsyncIterator[StreamEvent]], observer: RunObserver, single: bool
) -> AsyncGenerator[Any, None]:
    """Run ``run(observer)`` in a task and yield what the observer emits: ``(mode, chunk)``, or ``chunk`` alone
    when *single*."""
    queue: asyncio.Queue[Any] = asyncio.Queue()

    def emit(mode: str, chunk: Any) -> None:
        queue.put_nowait((mode, chunk))

    observer.emit = emit

    async def produce() -> None:
        async for event in run(observer):
            if event.result is not None:
                if "result" in observer.modes:
                    emit("result", event.result)
            elif "steps" in observer.modes:
                emit("steps", event)

    task = asyncio.ensure_future(produce())
    task.add_done_callback(lambda _: queue.put_nowait(_DONE))
    try:
        while (item := await queue.get()) is not _DONE:
            yield item[1] if single else item
        await task  # the run's error or crash, after everything it emitted before
    finally:
        if not task.done():  # the caller stopped reading: the run stops too (its lock is released)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
