"""The tool call being executed: its context (what a tool body may know about itself), the observers told about
every executed call, and the order in which parallel calls may complete under a test harness."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ToolCallInfo:
    """The tool call being executed: what a tool body (or an observer) may know about itself."""

    thread_id: str
    message_id: str
    call_id: str | None
    tool: str
    index: int
    key: str | None
    #: The tool's in-doubt policy ("retry", "fail", "reconcile"), None when it did not opt in.
    on_in_doubt: str | None = None
    #: The tool's effect class ("read", "idempotent", "external"), None when it says none.
    effect: str | None = None

    @property
    def idempotency_key(self) -> str:
        """A key for external APIs: the same on every replay and in every process, different for every other call.

        Derived from (thread_id, assistant message id, tool_call_id); pass it to payment or email providers.
        """
        digest = hashlib.sha256(f"{self.thread_id}\x00{self.execution_id}".encode()).hexdigest()
        return f"tenx-{digest[:40]}"

    @property
    def execution_id(self) -> str:
        """The ledger key, or (unprotected call) a stand-in that is still stable across replays of the message."""
        return self.key or f"unkeyed:{self.message_id}:{self.index}:{self.tool}"


ToolContext = ToolCallInfo
"""Declare a parameter of this type in a tool to receive the call's context (never shown to the model)."""


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
_observers: list[ToolObserver] = []
current_call_var: contextvars.ContextVar[ToolCallInfo | None] = contextvars.ContextVar("tenxgraph_tool", default=None)

CompletionOrder = Callable[[list[ToolCallInfo]], Sequence[int | Sequence[int]]]
"""Given the calls of a batch that are about to run, the order in which they may pass from their return to their
record: their ``index`` values, each alone or in a group (a list) of calls that return at the same moment and pass
together, so that their records form one group commit. Installed by test harnesses only
(:func:`set_completion_order`)."""
_completion_order: CompletionOrder | None = None


def current_tool_call() -> ToolCallInfo | None:
    """Inside a tool body: the call being executed (thread, message id, tool_call_id, ledger key)."""
    return current_call_var.get()


def add_tool_observer(observer: ToolObserver) -> Callable[[], None]:
    """Call *observer* with the :class:`ToolEvent` of every executed call (not of replays).

    Returns a function that removes it. Instrumentation for test harnesses; observers must be quick."""
    _observers.append(observer)
    return lambda: _observers.remove(observer) if observer in _observers else None


def notify(
    kind: str,
    info: ToolCallInfo,
    output: object = None,
    is_error: bool = False,
    at: float | None = None,
    update: object = None,
) -> None:
    if _observers:
        event = ToolEvent(kind, info, output, is_error, time.monotonic() if at is None else at, update)
        for observer in list(_observers):
            observer(event)


def completion_order() -> CompletionOrder | None:
    return _completion_order


def set_completion_order(order: CompletionOrder | None) -> None:
    """Make parallel calls pass from return to record in the order *order* gives (None: as they come), one at a
    time or a group at a time. Bodies still run concurrently; a returned call waits for its turn before it is
    reported and recorded.
    The crash-matrix harness installs a seeded order so that which siblings have returned or been recorded when a
    crash fires is decided by the seed, not by timing."""
    global _completion_order
    _completion_order = order


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


turns_var: contextvars.ContextVar[BatchTurns | None] = contextvars.ContextVar("tenxgraph_turns", default=None)


async def wait_for_turn(index: int) -> None:
    """Under a completion order, wait until every call before *index* in this batch is done (else return)."""
    turns = turns_var.get()
    if turns is not None:
        await turns.wait(index)


def finish_turn(index: int) -> None:
    """Call *index* of this batch is done: the next in the order may pass."""
    turns = turns_var.get()
    if turns is not None:
        turns.finish(index)
