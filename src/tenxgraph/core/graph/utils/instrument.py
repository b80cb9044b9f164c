"""The ledger's side of the instrumentation seam (:mod:`tenxgraph.utils.instrument`): the :class:`ToolEvent` every
executed call reports, and :class:`BatchTurns`, the completion order of one batch's parallel calls under a test
harness. The ledger calls these; they never call back into it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tenxgraph.core.tools.context import ToolCallInfo
from tenxgraph.utils import instrument
from tenxgraph.utils.constants import LOGGER_NAME
from tenxgraph.utils.instrument import CompletionOrder, Instrument

__all__ = [
    "BatchTurns",
    "CompletionOrder",
    "HandedOverTurns",
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


log = logging.getLogger(LOGGER_NAME)


def batch_turns(calls: list[ToolCallInfo], patience: float | None = None) -> BatchTurns | None:
    """The completion order of a batch of parallel calls, if an instrument installs one (else None); *patience*:
    the calls are handed over one by one by a framework (:class:`HandedOverTurns`)."""
    order = instrument.completion_order()
    if order is None or len(calls) < 2:
        return None
    return BatchTurns(order(calls)) if patience is None else HandedOverTurns(order(calls), patience)


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
        #: The order is over (given up or crashed): nothing waits for anything any more.
        self.ended = False

    @property
    def complete(self) -> bool:
        """Every call of the batch has passed (or the order is over)."""
        return self.ended or all(event.is_set() for event in self.done.values())

    async def wait(self, index: int) -> None:
        own = self.group_of[index]
        for group in self.groups[:own]:
            for before in group:
                await self.done[before].wait()
        go = self._go[index] = asyncio.get_running_loop().create_future()
        self._arrived.add(index)
        self._release_when_complete(own)
        await go

    def start(self, index: int) -> None:
        """Call *index* came in (all of a batch do at once here; see :class:`HandedOverTurns`)."""

    def abandon(self, crash: BaseException) -> None:
        """A call of the batch crashed (its siblings are cancelled with it here; see :class:`HandedOverTurns`)."""

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


class HandedOverTurns(BatchTurns):
    """The completion order of one assistant message's calls when a framework hands them over one by one (LangGraph's
    ``ToolNode`` through ``ReplaySafeToolNode``, each call from a thread of its own). Each call says when it comes
    in (:meth:`start`). A call still waited for that has not come in within *patience* seconds (the framework runs
    fewer calls at once than the message has, or sends one elsewhere) ends the order for the batch, with a WARNING,
    rather than holding its siblings forever; a crash in one call (:meth:`abandon`) ends it with that crash in every
    call still waiting, so that none records after it, as none would in a process that died there."""

    def __init__(self, order: Sequence[int | Sequence[int]], patience: float) -> None:
        super().__init__(order)
        self.patience = patience
        self.started = {index: asyncio.Event() for index in self.group_of}
        self.crash: BaseException | None = None

    def start(self, index: int) -> None:
        if index in self.started:
            self.started[index].set()

    async def wait(self, index: int) -> None:
        own = self.group_of[index]
        for n, group in enumerate(self.groups[: own + 1]):
            for other in group:
                if other != index and not await self._came_in(other):
                    return
                if n < own:
                    await self.done[other].wait()
                if self._over():
                    return
        go = self._go[index] = asyncio.get_running_loop().create_future()
        self._arrived.add(index)
        self._release_when_complete(own)
        if not self.ended:  # (else nothing is held any more)
            await go
        self._over()

    def end(self) -> None:
        """Give the order up: a call of the step paused (LangGraph cancels the calls it had not started yet),
        so the step runs again on resume; its calls under way pass as they return."""
        self._end()

    def abandon(self, crash: BaseException) -> None:
        """A call crashed: every call still waiting for its turn raises *crash* (and the order is over: a resume
        makes an order of its own)."""
        self.crash = self.crash or crash
        self._end()

    async def _came_in(self, index: int) -> bool:
        try:
            await asyncio.wait_for(self.started[index].wait(), self.patience)
        except TimeoutError:
            if not self.ended:
                log.warning(
                    "the completion order of a batch was not kept: call %d did not come in within %gs (the framework "
                    "ran fewer calls at once than the batch has); its siblings pass as they return", index,
                    self.patience,
                )  # fmt: skip
                self._end()
            return False
        return True

    def _over(self) -> bool:
        if self.crash is not None:
            raise self.crash
        return self.ended

    def _end(self) -> None:
        self.ended = True
        for event in (*self.started.values(), *self.done.values()):  # nothing waits for anything any more
            event.set()
        for go in self._go.values():
            if not go.done():
                go.set_result(None)
