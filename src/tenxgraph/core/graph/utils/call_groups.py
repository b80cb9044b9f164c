"""What the calls of one assistant message share when a framework hands them to the ledger one by one
(LangGraph's ``ToolNode``, each call from a thread of its own under ``invoke``; any loop that runs a message's
calls concurrently and calls :func:`~.invoke_node_handler.invoke_tool_call` per call): their group commit
(siblings that return together are recorded in one write), and, under a test harness, their completion order
(the order in which they pass from return to record, the seed's, not the threads'; from :data:`.probe.probe`).

A group lives while a call of it does (weakly held, per event loop, thread and message); under a harness's order
it is held until every call of the message has passed, so that a call answered from the ledger at once does not
take its siblings' order with it."""

from __future__ import annotations

import asyncio
import threading
import weakref

from tenxgraph.core.graph.utils.instrument import BatchTurns
from tenxgraph.core.graph.utils.probe import probe
from tenxgraph.core.graph.utils.record_batch import RecordBatch
from tenxgraph.core.tools.context import ToolCallInfo
from tenxgraph.state.messages import Message
from tenxgraph.storage.ledger_store import LedgerStore

__all__ = ["TURN_PATIENCE_S", "CallGroup", "CallGroups"]

#: Under a test harness's completion order: how long a call waits for a sibling the framework has not handed over
#: yet before the order is given up for the batch (LangGraph runs at most its executor's workers at once).
TURN_PATIENCE_S = 5.0

Key = tuple[int, str, str]


class CallGroup:
    """The calls of one assistant message: their group commit (:attr:`records`, pass it to ``invoke_tool_call``
    as ``records=``) and their completion order under a harness (:attr:`turns`, as ``turns=``; None in
    production)."""

    def __init__(self, key: Key, records: RecordBatch, turns: BatchTurns | None) -> None:
        self.key, self.records, self.turns = key, records, turns

    def current(self, ordered: bool) -> bool:
        """Whether a call of the message may join this group: not if its order ended (a crashed run's, kept
        alive by its traceback), nor if the harness's order came or went since they met."""
        if self.turns is not None:
            return ordered and not self.turns.ended
        return not ordered


class CallGroups:
    """The groups of the calls under way through one framework adapter (one per adapter object): ``group =
    groups.join(ledger, thread_id, message)`` before a call goes to the ledger, ``groups.passed(group)`` after
    (in a ``finally``)."""

    def __init__(self) -> None:
        self._groups: weakref.WeakValueDictionary[Key, CallGroup] = weakref.WeakValueDictionary()
        self._ordered: dict[Key, CallGroup] = {}  # (held until each call has passed: see the module's docstring)
        self._lock = threading.Lock()

    def join(self, ledger: LedgerStore, thread_id: str, message: Message) -> CallGroup:
        """The group of *message*'s calls on this event loop (made by its first call, over *ledger*)."""
        key = (id(asyncio.get_running_loop()), thread_id, message.message_id)
        ordered = probe.ordered()  # (a test harness orders the siblings' returns)
        with self._lock:
            group = self._ordered.get(key) or self._groups.get(key)
            if group is None or not group.current(ordered):
                turns = None
                if ordered:
                    calls = [
                        ToolCallInfo(thread_id, message.message_id, c.id, c.name, i, None)
                        for i, c in enumerate(message.tool_calls)
                    ]
                    turns = probe.turns(calls, patience=TURN_PATIENCE_S)
                group = self._groups[key] = CallGroup(key, RecordBatch(ledger, thread_id), turns)
                if turns is not None:
                    self._ordered[key] = group
            return group

    def passed(self, group: CallGroup) -> None:
        """A call of *group* is done: the group is let go once all of them are (or its order ended)."""
        if group.turns is not None and group.turns.complete:
            with self._lock:
                self._ordered.pop(group.key, None)
