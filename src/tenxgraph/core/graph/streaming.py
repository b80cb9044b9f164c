"""``stream(..., stream_mode=...)``: the run in a task of its own, its observer's output handed to the caller.

The run goes on while the caller reads (tokens arrive while a node runs, not only between nodes); what it emits
waits in a queue. A caller that stops reading early stops the run between nodes: the node under way finishes (its
tool calls are recorded), the run lock is released and the thread stays resumable; an error or a crash in the run
reaches the caller after what was emitted before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from tenxgraph.core.graph.results import StreamEvent
from tenxgraph.core.tools.observe import STREAM_MODES, RunObserver
from tenxgraph.utils.errors import ConfigError
from tenxgraph.utils.sync import run_sync

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


class RunStream:
    """``run(observer)`` in a task of its own, what the observer emits handed out in batches: ``(mode, chunk)``, or
    ``chunk`` alone when *single*. A batch is everything emitted since the last one (at least one item; empty at
    the end), so a sync caller crosses to the event loop once per batch, not once per token."""

    def __init__(
        self, run: Callable[[RunObserver], AsyncIterator[StreamEvent]], observer: RunObserver, single: bool
    ) -> None:
        self.run, self.observer, self.single = run, observer, single
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.task: asyncio.Future[None] | None = None
        self.ended = False
        observer.emit = self.emit

    def emit(self, mode: str, chunk: Any) -> None:
        self.queue.put_nowait((mode, chunk))

    async def _produce(self) -> None:
        async for event in self.run(self.observer):
            if event.result is not None:
                if "result" in self.observer.modes:
                    self.emit("result", event.result)
            elif "steps" in self.observer.modes:
                self.emit("steps", event)

    async def batch(self) -> list[Any]:
        """What was emitted since the last batch (waiting for one item); [] once the run is over. The run's error
        or crash is raised after everything it emitted before it."""
        if self.task is None:
            self.task = asyncio.ensure_future(self._produce())
            self.task.add_done_callback(lambda _: self.queue.put_nowait(_DONE))
        out: list[Any] = []
        while not self.ended and (not out or not self.queue.empty()):
            item = await self.queue.get() if not out else self.queue.get_nowait()
            if item is _DONE:
                self.ended = True
            else:
                out.append(item[1] if self.single else item)
        if not out and self.ended:
            await self.task  # the run's error, if it failed
        return out

    async def aclose(self) -> None:
        """The caller stopped reading: the run finishes the node under way and stops before the next one (a call in
        flight is recorded, never abandoned to run again on resume), then releases the thread, resumable. Never
        cancelled from here: if this wait is cancelled (a client gone), the run still stops by itself."""
        if self.task is not None and not self.task.done():
            self.observer.stop = True
            await asyncio.shield(self.task)


async def stream_run(stream: RunStream) -> AsyncGenerator[Any, None]:
    """The items of *stream*, one by one (the async path)."""
    try:
        while batch := await stream.batch():
            for item in batch:
                yield item
    finally:
        await stream.aclose()


def sync_stream(stream: RunStream) -> Iterator[Any]:
    """``CompiledGraph.stream`` with a mode: in batches, one hop to the event loop per batch, not per token."""
    try:
        while batch := run_sync(stream.batch()):
            yield from batch
    finally:  # a caller that stops early must not keep the thread's run lock until garbage collection
        run_sync(stream.aclose())


def sync_events(agen: AsyncGenerator[Any, None]) -> Iterator[Any]:
    """``CompiledGraph.stream`` without a mode: one event per hop to the event loop."""

    async def step() -> Any:
        return await anext(agen)

    try:
        while True:
            try:
                event = run_sync(step())
            except StopAsyncIteration:
                return
            yield event
    finally:  # a caller that stops early must not keep the thread's run lock until garbage collection
        run_sync(agen.aclose())
