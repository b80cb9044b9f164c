"""A run's first reads on PostgreSQL, made in its run lock's own round trip: the thread's state and (when the run
said which, ``hold_run_lock(messages_after=n)``) its messages after a sequence number, pipelined behind the lock
statement, then handed to the run's first ``aget_thread`` / ``alist_messages_after`` instead of reading again.
Any write of the thread forgets them (a read made before it is no longer the state).

And a new thread's start (``hold_run_lock(start=...)``): its first state write goes in the same round trip, behind
the reads, in the lock's transaction, written only where this run's lease was claimed and no thread exists yet;
the run's first ``aput_thread`` (the same write) is then answered from it. A refused run writes nothing; a thread
that exists is read as it is, and its run writes as usual.

And ledger records the run will read first (``hold_run_lock(ledger_keys=...)``: the decisions a ``Resume``
brings): read behind the lock, they answer the run's first ledger read if it asks for no other key. Any ledger
read or write of the thread forgets them.

No ledger read rides on a later state write: the tool node reads the ledger itself, after the points where the
thread may change hands (a run that took it over meanwhile may have recorded the calls; a read answered from the
write's round trip would not show them, and the calls would run again)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias

import psycopg

from tenxgraph.state.messages import JSON, Message
from tenxgraph.storage.checkpointer.base import MessagesAfter, ThreadSnapshot

#: A new thread's start sent with the lock: its values, its messages' ids, and the version it made (None: not
#: written, the thread existed or the lease was not claimed).
Started: TypeAlias = tuple[dict[str, JSON], tuple[str, ...], int | None]
#: Ledger keys read with the lock, and the records found under them.
Ledger: TypeAlias = tuple[frozenset[str], dict[str, dict[str, JSON]]]
#: The run's first reads, made in its run lock's round trip: the thread's state, its messages after a number, the
#: start written with them, and the ledger records read.
FirstReads: TypeAlias = tuple[ThreadSnapshot | None, tuple[int, MessagesAfter] | None, Started | None, Ledger | None]


class FirstReadsWithLock:
    """Per thread: which messages the run will read first, and what the lock's round trip read."""

    def __init__(self) -> None:
        self._messages_hint: dict[str, int] = {}
        self._state: dict[str, ThreadSnapshot | None] = {}
        self._messages: dict[str, tuple[int, MessagesAfter]] = {}
        self._start_hint: dict[str, tuple[dict[str, JSON], tuple[str, ...], str, str]] = {}
        self._started: dict[str, Started] = {}
        self._ledger_hint: dict[str, list[str]] = {}
        self._ledger: dict[str, Ledger] = {}

    def plan(self, thread_id: str, messages_after: int) -> None:
        self._messages_hint[thread_id] = messages_after

    def plan_start(
        self, thread_id: str, values: dict[str, JSON], messages: Sequence[Message], sql: tuple[str, str]
    ) -> None:
        """The run's first write, if its thread is new: its values and messages, and the state's JSON and the
        messages' rows (``json_rows``) that the statement sends."""
        self._start_hint[thread_id] = (values, tuple(m.message_id for m in messages), *sql)

    def plan_ledger(self, thread_id: str, keys: Sequence[str]) -> None:
        """The ledger records the run will read first (its keys)."""
        if keys:
            self._ledger_hint[thread_id] = list(dict.fromkeys(keys))

    def reader(
        self, thread_id: str, queries: dict[str, str]
    ) -> Callable[[psycopg.AsyncConnection[Any], str], Awaitable[Callable[[], Awaitable[FirstReads]]]]:
        """The statements to pipeline behind the lock (sent now, fetched after it), for ``PgRunLocks.hold``; they
        are given the connection and the lease's owner."""
        after = self._messages_hint.pop(thread_id, None)  # (taken now: nothing is left behind if opening fails)
        start = self._start_hint.pop(thread_id, None)
        keys = self._ledger_hint.pop(thread_id, None)

        async def reads(conn: psycopg.AsyncConnection[Any], owner: str) -> Callable[[], Awaitable[FirstReads]]:
            state = await conn.execute(queries["get_thread"], (thread_id,))
            if after is not None:
                listed = await conn.execute(queries["list_messages_after"], {"t": thread_id, "after": after})
            if start is not None:  # after the reads: they see the thread as it was before this run
                params = (thread_id, start[2], thread_id, owner, thread_id, start[3])
                created = await conn.execute(queries["create_thread_locked"], params)
            if keys is not None:
                recorded = await conn.execute(queries["get_results"], (thread_id, keys))

            async def fetch() -> FirstReads:
                found = await state.fetchone()
                snapshot = None if found is None else ThreadSnapshot(thread_id, found[1], int(found[0]))
                listing = None if after is None else (after, messages_after(await listed.fetchall()))
                started = None
                if start is not None:
                    made = await created.fetchone()
                    started = (start[0], start[1], None if made is None else int(made[0]))
                ledger = None
                if keys is not None:
                    ledger = (frozenset(keys), {row[0]: row[1] for row in await recorded.fetchall()})
                return snapshot, listing, started, ledger

            return fetch

        return reads

    def keep(self, thread_id: str, found: FirstReads) -> None:
        state, messages, started, ledger = found
        self._state[thread_id] = state
        if messages is not None:
            self._messages[thread_id] = messages
        if started is not None:
            self._started[thread_id] = started
        if ledger is not None:
            self._ledger[thread_id] = ledger

    def started(
        self, thread_id: str, expected_version: int, values: dict[str, JSON], messages: Sequence[Message]
    ) -> int | None:
        """The version of the run's first state write if the lock's round trip made it (nothing to encode or send
        again); None: write it now. Only the write that was sent can be answered so (anything else here would be
        the run loop's bug)."""
        sent = self._started.pop(thread_id, None)
        if sent is None or sent[2] is None:
            return None
        if (expected_version, values, tuple(m.message_id for m in messages)) != (0, sent[0], sent[1]):
            raise AssertionError(f"thread {thread_id!r}: the run's first write is not the start sent with its lock")
        return sent[2]

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

    def ledger(self, thread_id: str, keys: Sequence[str]) -> dict[str, dict[str, JSON]] | None:
        """The records of *keys* if the lock's round trip read them all (once: the thread's first ledger read takes
        them, whatever it asks for), else None: read them now."""
        pre = self._ledger.pop(thread_id, None)
        if pre is None or not pre[0].issuperset(keys):
            return None
        return {key: pre[1][key] for key in keys if key in pre[1]}

    def forget(self, thread_id: str) -> None:
        self._state.pop(thread_id, None)
        self._messages.pop(thread_id, None)
        self._started.pop(thread_id, None)
        self._ledger.pop(thread_id, None)


def messages_after(found: list[Any]) -> MessagesAfter:
    """The rows of ``list_messages_after``: the count and highest sequence number on every row (one row even when
    no message is newer), then each newer message's number and data."""
    rows = [(int(r[2]), Message.from_dict(r[3])) for r in found if r[2] is not None]
    return MessagesAfter(rows, int(found[0][0]), int(found[0][1]))
