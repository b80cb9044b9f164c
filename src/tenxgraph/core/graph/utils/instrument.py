"""The ledger's side of the instrumentation seam (:mod:`tenxgraph.utils.instrument`): the :class:`ToolEvent` every
executed call reports, and :class:`BatchTurns`, the completion order of one batch's parallel calls under a test
harness. The ledger calls these; they never call back into it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tenxgraph.core.tools.context import ToolCallInfo
from tenxgraph.utils import instrument
from tenxgraph.utils.instrument import CompletionOrder, Instrument

__all__ = [
    "BatchTurns",
    "CompletionOrder",
    "ToolEvent",
    "ToolObserver",
    "add_tool_observer",
    "finish_turn",
    "set_completion_order",
    "wait_turn",
]


@dataclass(frozen=True, slots=True)
class ToolEvent:
    """What a :data:`ToolObserver` is told. ``kind`` is ``"start"`` (the body is about to run), ``"end"`` (it
    returned or raised: ``output`` is what it returned, or the error text, with ``is_error``), ``"recorded"`` (its
    ledger record is written), ``"timeout"`` (it was cancelled) or ``"in_doubt"`` (a resume found its intent
    without a result). After a crash, a call whose last event is ``start`` was in flight, and one whose last event
    is ``end`` was between return and record."""

    kind: str
    call: ToolCallInfo
    output: object = None
    is_error: bool = False
    #: When it happened (``time.monotonic()``, one clock for every process of a machine); for ``end``, the moment
    #: the body returned, before any wait for its turn in a completion order.
    at: float = 0.0
    #: For ``end``: the state update the body returned with its output (a ``ToolOutput``'s), if any.
    update: object = None


ToolObserver = Callable[[ToolEvent], None]
"""Called with every :class:`ToolEvent` of executed (not replayed) calls."""


def add_tool_observer(observer: ToolObserver) -> Callable[[], None]:
    """Call *observer* with the :class:`ToolEvent` of every executed call (not of replays). Returns a function that
    removes it; observers must be quick. (An :class:`~tenxgraph.utils.instrument.Instrument` with ``on_tool``.)"""
    return instrument.install(Instrument(on_tool=observer))


def set_completion_order(order: CompletionOrder) -> Callable[[], None]:
    """Make parallel calls pass from return to record in the order *order* gives, one at a time or a group at a
    time; returns a function that removes it. Bodies still run concurrently; a returned call waits for its turn
    before it is reported and recorded. (An :class:`~tenxgraph.utils.instrument.Instrument` with
    ``completion_order``; the crash-matrix harness installs a seeded one, so that which siblings have returned or
    been recorded when a crash fires is decided by the seed, not by timing.)"""
    return instrument.install(Instrument(completion_order=order))


def notify(
    kind: str,
    info: ToolCallInfo,
    output: object = None,
    is_error: bool = False,
    at: float | None = None,
    update: object = None,
) -> None:
    """Tell the installed instruments of *info*'s event (see :class:`ToolEvent`)."""
    if not instrument.installed:
        return
    event = ToolEvent(kind, info, output, is_error, time.monotonic() if at is None else at, update)
    for watcher in instrument.installed:
        if watcher.on_tool is not None:
            watcher.on_tool(event)


async def wait_turn(turns: BatchTurns | None, index: int) -> None:
    """Under a completion order, wait until every call before *index* in its batch is done (else return)."""
    if turns is not None:
        await turns.wait(index)


def finish_turn(turns: BatchTurns | None, index: int) -> None:
    """Call *index* of its batch is done: the next in the order may pass."""
    if turns is not None:
        turns.finish(index)


def batch_turns(calls: list[ToolCallInfo]) -> BatchTurns | None:
    """The completion order of a batch of parallel calls, if an instrument installs one (else None)."""
    order = instrument.completion_order()
    return BatchTurns(order(calls)) if order is not None and len(calls) > 1 else None


class BatchTurns:
    """The completion order of one batch, as groups: a call may pass once every call of the groups before its own is
    done and every call of its own group has returned (or finished without running). The calls of a group then
    pass in one turn of the event loop, in the group's listed order (the same in every process), as siblings that
    return at the same moment do, so that their records form one group commit."""

    def __init__(self, order: Sequence[int | Sequence[int]]) -> None:
        self.groups = [[g] if isinstance(g, int) else list(g) for g in order]
        self.group_of = {index: n for n, group in enumerate(self.groups) for index in group}
        self.done = {index: asyncio.Event() for index in self.group_of}
        self._arrived: set[int] = set()
        self._go: dict[int, asyncio.Future[None]] = {}
        self._released: set[int] = set()

    async def wait(self, index: int) -> None:
        own = self.group_of[index]
        for group in self.groups[:own]:
            for before in group:
                await self.done[before].wait()
        go = self._go[index] = asyncio.get_running_loop().create_future()
        self._arrived.add(index)
        self._release_when_complete(own)
        await go

    def finish(self, index: int) -> None:
        self._arrived.add(index)  # (a call answered without running never waits: its group must not wait for it)
        self.done[index].set()
        self._release_when_complete(self.group_of[index])

    def _release_when_complete(self, n: int) -> None:
        group = self.groups[n]
        if n in self._released or not self._arrived.issuperset(group):
            return
        self._released.add(n)
        asyncio.get_running_loop().call_soon(self._release, group)  # one turn: every member is awaiting its go

    def _release(self, group: list[int]) -> None:
        for index in group:  # wake-ups run in this order, each call up to its record write
            go = self._go.get(index)
            if go is not None and not go.done():
                go.set_result(None)
