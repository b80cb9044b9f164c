"""What the calls of one assistant message share when a framework hands them to the ledger one by one
(LangGraph's ``ToolNode``, each call from a thread of its own under ``invoke``; any loop that runs a message's
calls concurrently and calls :func:`~.invoke_node_handler.invoke_tool_call` per call): their group commit
(siblings that return together are recorded in one write), their ledger read (one for all of them, when the
caller names the execution of the step: :mod:`.shared_read`), and, under a test harness, their completion order
(the order in which they pass from return to record, the seed's, not the threads'; from :data:`.probe.probe`).

A group lives while a call of it does (weakly held, per event loop, thread, message and execution); a group of a
named execution is held too until :data:`RECENT_EXECUTIONS` later executions have come (a framework may hand a
step's calls over in waves, past its thread pool's size, and the read is the step's); under a harness's order it
is held until every call of the message has passed, so that a call answered from the ledger at once does not
take its siblings' order with it."""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import OrderedDict
from collections.abc import Collection

from tenxgraph.core.graph.utils.instrument import BatchTurns, HandedOverTurns
from tenxgraph.core.graph.utils.probe import probe
from tenxgraph.core.graph.utils.record_batch import RecordBatch
from tenxgraph.core.graph.utils.shared_read import Records, SharedRead
from tenxgraph.core.tools.context import ToolCallInfo
from tenxgraph.state.messages import Message
from tenxgraph.storage.ledger_store import LedgerStore

__all__ = ["RECENT_EXECUTIONS", "TURN_PATIENCE_S", "CallGroup", "CallGroups"]

#: Under a test harness's completion order: how long a call waits for a sibling the framework has not handed over
#: yet before the order is given up for the batch (LangGraph runs at most its executor's workers at once).
TURN_PATIENCE_S = 5.0
#: How many executions of steps a :class:`CallGroups` keeps the groups of after their calls passed.
RECENT_EXECUTIONS = 64

Key = tuple[int, str, str, int]


class CallGroup:
    """The calls of one assistant message (pass it to ``invoke_tool_call`` as ``group=``): their group commit
    (:attr:`records`), their shared ledger read (:attr:`reads`; None: each call reads its own), and their
    completion order under a harness (:attr:`turns`; None in production)."""

    def __init__(
        self, key: Key, records: RecordBatch, turns: BatchTurns | None, reads: SharedRead | None = None
    ) -> None:
        self.key, self.records, self.turns, self.reads = key, records, turns, reads
        self.paused = False  # a call paused (its order was given up): its siblings still join this group

    def reading(self, records: Records, ordered: bool = True) -> CallGroup:
        """This group, but its calls answer from *records*, a read made already (for an approval, say); not
        *ordered*: without the harness's completion order (calls under a step's lock pass one at a time: an
        order that holds one for a sibling would wait for a sibling the lock holds back)."""
        return CallGroup(self.key, self.records, self.turns if ordered else None, SharedRead.known(records))

    def current(self, ordered: bool) -> bool:
        """Whether a call of the message may join this group: not if its order ended (a crashed run's, kept
        alive by its traceback), nor if the harness's order came or went since they met."""
        if self.turns is not None:
            return ordered and (self.paused or not self.turns.ended)
        return not ordered


class CallGroups:
    """The groups of the calls under way through one framework adapter (one per adapter object): ``group =
    groups.join(ledger, thread_id, message, execution)`` before a call goes to the ledger, ``groups.passed(group)``
    after (in a ``finally``)."""

    def __init__(self) -> None:
        self._groups: weakref.WeakValueDictionary[Key, CallGroup] = weakref.WeakValueDictionary()
        self._ordered: dict[Key, CallGroup] = {}  # (held until each call has passed: see the module's docstring)
        #: Keeps the groups of the last executions alive, each with its execution (whose id names no other
        #: meanwhile).
        self._recent: OrderedDict[Key, tuple[CallGroup, object]] = OrderedDict()
        self._lock = threading.Lock()

    def join(
        self,
        ledger: LedgerStore,
        thread_id: str,
        message: Message,
        execution: object | None = None,
        coming: Collection[str] | None = None,
    ) -> CallGroup:
        """The group of *message*'s calls on this event loop (made by its first call, over *ledger*). *execution*:
        an object that is the same for the calls of one execution of the step and new for every other (LangGraph's
        task scratchpad); given, the calls share one ledger read (:attr:`CallGroup.reads`). *coming*: the ids of
        the calls the framework hands over in this execution, if it says (a harness's completion order is then
        kept among those alone: a sibling it skips, defers or runs later never comes in to take its turn)."""
        key = (id(asyncio.get_running_loop()), thread_id, message.message_id, id(execution))
        ordered = probe.ordered()  # (a test harness orders the siblings' returns)
        with self._lock:
            for stale in [k for k, g in self._ordered.items() if g.turns is not None and g.turns.ended]:
                del self._ordered[stale]  # (a crashed run's order: its calls will not all pass)
            group = self._ordered.get(key) or self._groups.get(key)  # (those in _recent are alive: held there)
            if group is None or not group.current(ordered):
                turns = None
                if ordered:
                    calls = [
                        ToolCallInfo(thread_id, message.message_id, c.id, c.name, i, None)
                        for i, c in enumerate(message.tool_calls)
                        if coming is None or c.id in coming
                    ]
                    turns = probe.turns(calls, patience=TURN_PATIENCE_S)
                reads = SharedRead() if execution is not None else None
                group = self._groups[key] = CallGroup(key, RecordBatch(ledger, thread_id), turns, reads)
                if turns is not None:
                    self._ordered[key] = group
                if execution is not None:
                    self._recent[key] = (group, execution)
                    self._recent.move_to_end(key)
                    while len(self._recent) > RECENT_EXECUTIONS:
                        self._recent.popitem(last=False)
            return group

    def pass_over(
        self, ledger: LedgerStore, thread_id: str, message: Message, execution: object | None, index: int
    ) -> None:
        """Call *index* of *message* paused before the ledger in this execution (at an ``interrupt()``): under a
        harness's completion order its siblings stop waiting for it, and for those LangGraph then cancels."""
        group = self.join(ledger, thread_id, message, execution)
        if isinstance(group.turns, HandedOverTurns):
            group.paused = True
            group.turns.end()
        self.passed(group)

    def passed(self, group: CallGroup) -> None:
        """A call of *group* is done: the group is let go once all of them are (or its order ended)."""
        if group.turns is not None and group.turns.complete:
            with self._lock:
                self._ordered.pop(group.key, None)
