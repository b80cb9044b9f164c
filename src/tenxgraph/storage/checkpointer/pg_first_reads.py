"""A run's first reads on PostgreSQL, made in its run lock's own round trip: the thread's state and (when the run
said which, ``hold_run_lock(messages_after=n)``) its messages after a sequence number, pipelined behind the lock
statement, then handed to the run's first ``aget_thread`` / ``alist_messages_after`` instead of reading again.
Any write of the thread forgets them (a read made before it is no longer the state)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import psycopg

from tenxgraph.state.messages import Message
from tenxgraph.storage.checkpointer.base import MessagesAfter, ThreadSnapshot

#: The run's first reads, made in its run lock's round trip: the thread's state, and its messages after a number.
FirstReads: TypeAlias = tuple[ThreadSnapshot | None, tuple[int, MessagesAfter] | None]


class FirstReadsWithLock:
    """Per thread: which messages the run will read first, and what the lock's round trip read."""

    def __init__(self) -> None:
        self._messages_hint: dict[str, int] = {}
        self._state: dict[str, ThreadSnapshot | None] = {}
        self._messages: dict[str, tuple[int, MessagesAfter]] = {}

    def plan(self, thread_id: str, messages_after: int) -> None:
        self._messages_hint[thread_id] = messages_after

    def reader(
        self, thread_id: str, queries: dict[str, str]
    ) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[Callable[[], Awaitable[FirstReads]]]]:
        """The statements to pipeline behind the lock (sent now, fetched after it), for ``PgRunLocks.hold``."""
        after = self._messages_hint.pop(thread_id, None)  # (taken now: nothing is left behind if opening fails)

        async def reads(conn: psycopg.AsyncConnection[Any]) -> Callable[[], Awaitable[FirstReads]]:
            state = await conn.execute(queries["get_thread"], (thread_id,))
            if after is not None:
                listed = await conn.execute(queries["list_messages_after"], {"t": thread_id, "after": after})

            async def fetch() -> FirstReads:
                found = await state.fetchone()
                snapshot = None if found is None else ThreadSnapshot(thread_id, found[1], int(found[0]))
                return snapshot, None if after is None else (after, messages_after(await listed.fetchall()))

            return fetch

        return reads

    def keep(self, thread_id: str, found: FirstReads) -> None:
        state, messages = found
        self._state[thread_id] = state
        if messages is not None:
            self._messages[thread_id] = messages

    def state(self, thread_id: str) -> tuple[bool, ThreadSnapshot | None]:
        """``(True, state)`` once if the lock's round trip read the thread's state, else ``(False, None)``."""
        if thread_id in self._state:
            return True, self._state.pop(thread_id)
        return False, None

    def messages(self, thread_id: str, after_seq: int) -> MessagesAfter | None:
        pre = self._messages.get(thread_id)
        if pre is not None and pre[0] == after_seq:
            del self._messages[thread_id]
            return pre[1]
        return None

    def forget(self, thread_id: str) -> None:
        self._state.pop(thread_id, None)
        self._messages.pop(thread_id, None)


def messages_after(found: list[Any]) -> MessagesAfter:
    """The rows of ``list_messages_after``: the count and highest sequence number on every row (one row even when
    no message is newer), then each newer message's number and data."""
    rows = [(int(r[2]), Message.from_dict(r[3])) for r in found if r[2] is not None]
    return MessagesAfter(rows, int(found[0][0]), int(found[0][1]))
