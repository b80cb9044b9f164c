"""What the calls of one ``AIMessage`` share under ``ReplaySafeToolNode``, which LangGraph's ``ToolNode`` hands over
one by one (each from a thread of its own under ``invoke``): their group commit (siblings that return together are
recorded in one write), and, under a test harness, their completion order (:class:`HandedOverTurns`: the order in
which they pass from return to record, the seed's, not the threads').

A group lives while a call of it does (weakly held, per event loop, thread and message); under a harness's order
it is held until every call of the message has passed, so that a call answered from the ledger at once does not
take its siblings' order with it."""

from __future__ import annotations

import asyncio
import threading
import weakref

from tenxgraph.core.graph.utils.instrument import BatchTurns, HandedOverTurns, batch_turns
from tenxgraph.core.graph.utils.record_batch import RecordBatch
from tenxgraph.core.tools.context import ToolCallInfo
from tenxgraph.state.messages import Message
from tenxgraph.storage.checkpointer.base import BaseCheckpointer
from tenxgraph.utils import instrument

__all__ = ["TURN_PATIENCE_S", "SiblingGroups", "Siblings"]

#: Under a test harness's completion order: how long a call waits for a sibling LangGraph has not handed over yet
#: before the order is given up for the batch (LangGraph runs at most its executor's workers at once).
TURN_PATIENCE_S = 5.0

Key = tuple[int, str, str]


class Siblings:
    """The calls of one AIMessage: their group commit, and their completion order under a harness."""

    def __init__(self, key: Key, records: RecordBatch, turns: BatchTurns | None) -> None:
        self.key, self.records, self.turns = key, records, turns

    def current(self, ordered: bool) -> bool:
        """Whether a call of the message may join these siblings: not if their order ended (a crashed run's, kept
        alive by its traceback), nor if the harness's order came or went since they met."""
        if isinstance(self.turns, HandedOverTurns):
            return ordered and not self.turns.ended
        return not ordered


class SiblingGroups:
    """The groups of one ``ReplaySafeToolNode``'s calls under way."""

    def __init__(self) -> None:
        self._groups: weakref.WeakValueDictionary[Key, Siblings] = weakref.WeakValueDictionary()
        self._ordered: dict[Key, Siblings] = {}  # (held until each call has passed: see the module's docstring)
        self._lock = threading.Lock()

    def join(self, ledger: BaseCheckpointer, thread_id: str, message: Message) -> Siblings:
        """The group of *message*'s calls on this event loop (made by its first call, over *ledger*)."""
        key = (id(asyncio.get_running_loop()), thread_id, message.message_id)
        ordered = instrument.completion_order() is not None  # (a test harness orders the siblings' returns)
        with self._lock:
            group = self._ordered.get(key) or self._groups.get(key)
            if group is None or not group.current(ordered):
                turns = None
                if ordered:
                    calls = [
                        ToolCallInfo(thread_id, message.message_id, c.id, c.name, i, None)
                        for i, c in enumerate(message.tool_calls)
                    ]
                    turns = batch_turns(calls, patience=TURN_PATIENCE_S)
                group = self._groups[key] = Siblings(key, RecordBatch(ledger, thread_id), turns)
                if turns is not None:
                    self._ordered[key] = group
            return group

    def passed(self, group: Siblings) -> None:
        """A call of *group* is done: the group is let go once all of them are (or its order ended)."""
        if isinstance(group.turns, HandedOverTurns) and group.turns.complete:
            with self._lock:
                self._ordered.pop(group.key, None)
