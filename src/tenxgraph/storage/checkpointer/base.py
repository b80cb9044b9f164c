"""The checkpointer interface: versioned thread state, an append-only message log, and the tool ledger.

A checkpointer is small on purpose: ten abstract async methods, plus the run lock (:meth:`arun_lock`) and its
fencing check (:meth:`acheck_run_lock`), which have process-local defaults. :mod:`pytest_replaysafe.conformance`
runs the same contract against every implementation. Sync wrappers come for free from this base class.

Contract, for every backend:
- Values go in and come out as copies (JSON round trip); nothing is shared by reference.
- ``aput_thread`` is a compare-and-swap on the thread's version: it writes only if the stored version equals
  ``expected_version`` (0 = the thread does not exist yet), stores ``new_messages`` in the same atomic step,
  and returns the new version. Otherwise it raises :class:`StaleStateError` and writes nothing.
- Messages are keyed by ``message_id``: storing a message that is already stored does nothing.
- The ledger maps ``(thread_id, key)`` to a JSON record; the first write wins and later writes are ignored.
  ``aget_tool_results`` answers for many keys in one call.

The run loop holds a thread through :func:`hold_run_lock` and speaks to it through a :class:`RunLockSession`.
(Past the ~350-line guide: the contract, its sync wrappers and the helpers every backend shares, in one place.)
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from tenxgraph.state.messages import JSON, Message, dumps, id_problem
from tenxgraph.utils.backoff import Backoff
from tenxgraph.utils.constants import THREAD_ID_MAX_BYTES
from tenxgraph.utils.errors import ConfigError, SerializationError, ThreadBusyError
from tenxgraph.utils.sync import run_sync


@dataclass(frozen=True, slots=True)
class ThreadSnapshot:
    """A thread's stored state (every field but ``messages``) and its version."""

    thread_id: str
    values: dict[str, JSON]
    version: int


@dataclass(frozen=True, slots=True)
class MessagesAfter:
    """:meth:`BaseCheckpointer.alist_messages_after`: ``rows`` as ``(seq, message)``, ``count`` messages in the
    thread and ``last_seq`` the highest sequence number (0 for none), all read at one moment. Sequence numbers
    grow with every message stored and are never reused, so a reader that kept the log up to some ``seq`` knows
    from ``count`` whether the rows complete it."""

    rows: list[tuple[int, Message]]
    count: int
    last_seq: int


def check_thread_id(thread_id: object) -> str:
    """One rule for thread ids on every backend, checked before anything is written (see ``id_problem``)."""
    problem = id_problem(thread_id, THREAD_ID_MAX_BYTES)
    if problem is not None:
        raise ConfigError(f"thread_id {problem}")
    assert isinstance(thread_id, str)
    return thread_id


class BaseCheckpointer(ABC):
    """Storage behind a compiled graph. Subclasses implement the ``a*`` methods."""

    async def alist_interrupted_threads(self, limit: int = 100) -> list[str]:
        """Up to *limit* threads whose stored run status is ``running``: a run is on them now, or was interrupted
        (its process died). Recovery tries each with the run lock, which tells the two apart."""
        raise NotImplementedError(f"{type(self).__name__} cannot list interrupted threads (recovery needs it)")

    def list_interrupted_threads(self, limit: int = 100) -> list[str]:
        return run_sync(self.alist_interrupted_threads(limit))

    async def acount_threads(self, status: str) -> int:
        """How many threads have run status *status* (``interrupted``: threads waiting for a person; the server's
        metrics read it). One query; the default says this storage cannot."""
        raise NotImplementedError(f"{type(self).__name__} cannot count threads by status")

    def count_threads(self, status: str) -> int:
        return run_sync(self.acount_threads(status))

    #: Whether a tool can write to this checkpointer's database in the ledger's own transaction (:meth:`atransact`),
    #: and how: ``"sync"`` (the tool is a plain function, run in a worker thread) or ``"async"`` (a coroutine).
    transactions: str | None = None

    async def atransact(self, thread_id: str, key: str, work: Callable[[Any], Any]) -> tuple[dict[str, JSON], bool]:
        """Run ``work(connection)`` (returning the record, or for ``"async"`` an awaitable of it) and store the
        record under *key* in one transaction: both commit, or (an exception, a crash) neither. If a completed
        record is stored under *key* already, *work* does not run and that record is returned, with False."""
        raise NotImplementedError(f"{type(self).__name__} cannot run a tool in the ledger's transaction")

    # -- thread state -----------------------------------------------------------------------------------
    @abstractmethod
    async def aget_thread(self, thread_id: str) -> ThreadSnapshot | None:
        """The stored state of *thread_id*, or None if the thread does not exist."""

    @abstractmethod
    async def aput_thread(
        self,
        thread_id: str,
        values: dict[str, JSON],
        *,
        expected_version: int,
        new_messages: Sequence[Message] = (),
    ) -> int:
        """Compare-and-swap the thread state and append *new_messages* atomically; return the new version."""

    # -- messages ---------------------------------------------------------------------------------------
    @abstractmethod
    async def alist_messages(self, thread_id: str) -> list[Message]:
        """The thread's messages in the order they were stored."""

    async def alist_messages_after(self, thread_id: str, after_seq: int) -> MessagesAfter | None:
        """The thread's messages stored after sequence number *after_seq* (0: all), in order, with the thread's
        message count and highest sequence number, read at one moment: what lets a run load only a turn's new
        messages (see ``tenxgraph.core.graph.message_cache``). None (the default) when this storage keeps no
        sequence numbers; runs then read the whole log."""
        return None

    @abstractmethod
    async def aappend_messages(self, thread_id: str, messages: Sequence[Message]) -> None:
        """Store messages outside a state write (already stored ids are skipped; the version is unchanged)."""

    # -- tool ledger ------------------------------------------------------------------------------------
    @abstractmethod
    async def aget_tool_results(self, thread_id: str, keys: Sequence[str]) -> dict[str, dict[str, JSON]]:
        """Records for those of *keys* that have one, in one round trip."""

    @abstractmethod
    async def aput_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        """Store *record* under *key* unless a result is stored already (first write wins; an intent is replaced).
        True if this call wrote it."""

    async def aput_tool_results(
        self, thread_id: str, records: Sequence[tuple[str, dict[str, JSON]]]
    ) -> list[bool | SerializationError]:
        """Several records (distinct keys) as one durable write where the storage can (one transaction, one commit):
        the ledger's group commit for parallel calls that return together. Per record, as
        :meth:`aput_tool_result`: True if written, False if a result was stored already; a record that cannot be
        stored gets its :class:`SerializationError` in its place and the others are still written. The default
        writes them one by one."""
        out: list[bool | SerializationError] = []
        for key, record in records:
            try:
                out.append(await self.aput_tool_result(thread_id, key, record))
            except SerializationError as exc:
                out.append(exc)
        return out

    @abstractmethod
    async def aput_tool_intent(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        """Store an intent (status ``started``) under *key* unless anything is stored there. True if written.

        A later :meth:`aput_tool_result` for the key replaces the intent (status ``completed``); reads return the
        intent's own envelope (``"kind": "intent"``) until then."""

    @abstractmethod
    async def alist_tool_results(self, thread_id: str) -> dict[str, dict[str, JSON]]:
        """Every ledger record of the thread (for inspection and tests)."""

    @abstractmethod
    async def aprune_tool_executions(
        self,
        older_than: timedelta,
        *,
        include_resumable: bool = False,
        finished: Sequence[str] = (),
        batch_size: int = 1000,
    ) -> int:
        """Delete ledger records created more than *older_than* ago, in batches; return how many were deleted.

        Only records of a thread this store sees finished go: it has a thread row, and its status is not
        resumable (``running``, ``error``, ``interrupted``). A thread whose state another framework keeps (LangGraph,
        a loop calling :mod:`tenxgraph.ledger`) has no row here and may be paused for a person: its records stay
        unless its id is in *finished* (the caller vouches its runs are over; see
        ``tenxgraph.integrations.langgraph.prune_ledger``). ``include_resumable=True`` deletes every old record
        (a resume then re-runs calls that already happened)."""

    # -- lifecycle --------------------------------------------------------------------------------------
    @abstractmethod
    async def adelete_thread(self, thread_id: str) -> None:
        """Remove the thread, its messages and its ledger records."""

    def arun_lock(self, thread_id: str) -> AbstractAsyncContextManager[None]:
        """The exclusive right to run *thread_id*, held for a whole run; :class:`ThreadBusyError` if another run
        holds it. Released when the run ends, and by the operating system or database when its process dies, so
        a crashed worker never blocks recovery. The default is process-local (right for in-memory storage)."""
        return _local_run_lock(self, thread_id)

    def read_with_lock(self, thread_id: str, messages_after: int) -> None:
        """A hint from the run loop, before it takes the run lock of *thread_id*: its first reads will be the
        thread's state and its messages stored after sequence number *messages_after*. A checkpointer may read them
        in the lock's own round trip and answer those first reads from it (PostgreSQL does). The default does
        nothing."""

    def write_with_lock(self, thread_id: str, values: dict[str, JSON], *, new_messages: Sequence[Message]) -> None:
        """A hint from the run loop, before it takes the run lock of a thread it has not read: if the thread is new,
        the run's first state write will be ``aput_thread(thread_id, values, expected_version=0, new_messages=...)``.
        A checkpointer may make that write in the lock's own round trip, only if the lock is granted and no thread
        exists, and answer that first write from it (PostgreSQL does). The default does nothing."""

    def read_ledger_with_lock(self, thread_id: str, keys: Sequence[str]) -> None:
        """A hint from the run loop, before it takes the run lock of *thread_id*: its first ledger read will ask for
        (some of) *keys* (the decisions a ``Resume`` brings). A checkpointer may read them in the lock's own round
        trip and answer that first read from it (PostgreSQL does). The default does nothing."""

    def release_lock_with_next_write(self, thread_id: str) -> None:
        """A hint from the run loop: the next state write of *thread_id* is the last one of a run that holds its
        run lock. A checkpointer may release the lock in the same round trip, after the write (PostgreSQL
        pipelines the unlock behind it); if that write never happens, the lock is released as usual when
        :meth:`arun_lock` exits. The default does nothing."""

    async def acheck_run_lock(self, thread_id: str) -> None:
        """Fencing: raise :class:`RunLockLostError` if this process no longer holds the run lock of *thread_id* it
        took with :meth:`arun_lock`. The run loop asks before invoking each tool and before each state write. The
        default does nothing: a process-local lock, or an ``flock``, cannot be lost while its process lives."""

    async def aclose(self) -> None:
        """Release connections. The default does nothing."""

    # -- sync wrappers ----------------------------------------------------------------------------------
    def get_thread(self, thread_id: str) -> ThreadSnapshot | None:
        return run_sync(self.aget_thread(thread_id))

    def put_thread(
        self,
        thread_id: str,
        values: dict[str, JSON],
        *,
        expected_version: int,
        new_messages: Sequence[Message] = (),
    ) -> int:
        return run_sync(
            self.aput_thread(thread_id, values, expected_version=expected_version, new_messages=new_messages)
        )

    def list_messages(self, thread_id: str) -> list[Message]:
        return run_sync(self.alist_messages(thread_id))

    def append_messages(self, thread_id: str, messages: Sequence[Message]) -> None:
        run_sync(self.aappend_messages(thread_id, messages))

    def get_tool_results(self, thread_id: str, keys: Sequence[str]) -> dict[str, dict[str, JSON]]:
        return run_sync(self.aget_tool_results(thread_id, keys))

    def put_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        return run_sync(self.aput_tool_result(thread_id, key, record))

    def put_tool_intent(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        return run_sync(self.aput_tool_intent(thread_id, key, record))

    def list_tool_results(self, thread_id: str) -> dict[str, dict[str, JSON]]:
        return run_sync(self.alist_tool_results(thread_id))

    def prune_tool_executions(
        self,
        older_than: timedelta,
        *,
        include_resumable: bool = False,
        finished: Sequence[str] = (),
        batch_size: int = 1000,
    ) -> int:
        prune = self.aprune_tool_executions
        return run_sync(
            prune(older_than, include_resumable=include_resumable, finished=finished, batch_size=batch_size)
        )

    def delete_thread(self, thread_id: str) -> None:
        run_sync(self.adelete_thread(thread_id))

    def close(self) -> None:
        run_sync(self.aclose())

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def encode_group(
    records: Sequence[tuple[str, dict[str, JSON]]],
) -> tuple[list[bool | SerializationError], list[tuple[int, str, str]]]:
    """For :meth:`BaseCheckpointer.aput_tool_results`: the outcome list (each record's SerializationError in its
    place, False elsewhere until written) and ``(index, key, json)`` of the records to write, the first of each key
    only (one statement cannot update a row twice)."""
    out: list[bool | SerializationError] = []
    texts: list[tuple[int, str, str]] = []
    keys: set[str] = set()
    for i, (key, record) in enumerate(records):
        try:
            text = dumps(record, f"ledger record {key!r}")
        except SerializationError as exc:
            out.append(exc)
            continue
        out.append(False)
        if key not in keys:
            keys.add(key)
            texts.append((i, key, text))
    return out, texts


def encode_messages(messages: Iterable[Message]) -> list[tuple[str, str]]:
    """``(message_id, json)`` pairs, raising a clear error for a message that cannot be stored."""
    return [(m.message_id, dumps(m.to_dict(), f"message {m.message_id}")) for m in messages]


#: Between attempts at a busy thread's run lock: 5 ms, doubled each time, at most 0.1 s (or the holder's lease).
BUSY_BACKOFF = Backoff(0.005, 2.0, 0.1)


@dataclass(frozen=True, slots=True)
class RunLockSession:
    """A held run lock, as the run loop sees it: what it says about its run goes through here, and each backend
    makes of it what it can (PostgreSQL saves round trips with it; the others need nothing)."""

    checkpointer: BaseCheckpointer
    thread_id: str

    async def write(
        self,
        values: dict[str, JSON],
        *,
        expected_version: int,
        new_messages: Sequence[Message],
    ) -> int:
        """The run's state write, fenced: :class:`RunLockLostError` (nothing written) once the lock is another
        run's; else :meth:`BaseCheckpointer.aput_thread`'s compare-and-swap, and the new version. No ledger read
        rides on it: the tool node reads the ledger after the points where the thread may change hands (a read
        answered from this write's round trip missed the records of a run that took the thread in between)."""
        await self.checkpointer.acheck_run_lock(self.thread_id)
        return await self.checkpointer.aput_thread(
            self.thread_id, values, expected_version=expected_version, new_messages=new_messages
        )

    def next_write_is_last(self) -> None:
        """The run's next state write is its last one: the lock may be released in the same round trip, after the
        write (if that write never happens, the lock is released as usual when the session ends)."""
        self.checkpointer.release_lock_with_next_write(self.thread_id)


@asynccontextmanager
async def hold_run_lock(
    checkpointer: BaseCheckpointer,
    thread_id: str,
    timeout: float | None,
    *,
    messages_after: int | None = None,
    start: tuple[dict[str, JSON], Sequence[Message]] | None = None,
    ledger_keys: Sequence[str] = (),
) -> AsyncIterator[RunLockSession]:
    """Hold *checkpointer*'s run lock on *thread_id*, waiting up to *timeout* seconds (None: not at all) while
    another run holds it; then :class:`ThreadBusyError`, saying how long it waited. *messages_after*: the run's
    first reads will be the thread's state and its messages stored after that sequence number (a backend may
    read them with the lock). *start*: the values and messages of the run's first write if the thread is new
    (:meth:`BaseCheckpointer.write_with_lock`). *ledger_keys*: the run's first ledger read
    (:meth:`BaseCheckpointer.read_ledger_with_lock`)."""
    if ledger_keys:
        checkpointer.read_ledger_with_lock(thread_id, ledger_keys)
    if messages_after is not None:
        checkpointer.read_with_lock(thread_id, messages_after)
    if start is not None:
        checkpointer.write_with_lock(thread_id, start[0], new_messages=start[1])
    deadline = time.monotonic() + (timeout or 0.0)
    delays = BUSY_BACKOFF.delays()
    while True:
        lock = checkpointer.arun_lock(thread_id)
        try:
            await lock.__aenter__()
        except ThreadBusyError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                if timeout:
                    raise ThreadBusyError(thread_id, timeout, exc.holder, exc.retry_after) from None
                raise
            # (a lease's holder that stops renewing frees the thread no sooner than retry_after: no busy polling)
            await asyncio.sleep(min(max(next(delays), min(exc.retry_after or 0.0, 1.0)), left))
            continue
        break
    try:
        yield RunLockSession(checkpointer, thread_id)
    except BaseException as exc:
        if not await lock.__aexit__(type(exc), exc, exc.__traceback__):
            raise
    else:
        await lock.__aexit__(None, None, None)


_local_locks_guard = threading.Lock()


@asynccontextmanager
async def _local_run_lock(owner: object, thread_id: str) -> AsyncIterator[None]:
    """The default run lock: the threads this checkpointer object runs now, kept on the object itself."""
    with _local_locks_guard:
        held: set[str] = owner.__dict__.setdefault("_locally_held_threads", set())
        if thread_id in held:
            raise ThreadBusyError(thread_id)
        held.add(thread_id)
    try:
        yield
    finally:
        with _local_locks_guard:
            held.discard(thread_id)


def migration_plan(current: int, migrations: Mapping[int, list[str]], where: str) -> list[tuple[int, list[str]]]:
    """The forward migrations that take a store from schema version *current* to the newest one, in order; a
    store newer than this code is a :class:`ConfigError` (never downgraded, never misread)."""
    newest = max(migrations)
    if current > newest:
        raise ConfigError(
            f"{where} is at schema version {current}, newer than this 10xgraph's ({newest}); upgrade 10xgraph"
        )
    return [(version, migrations[version]) for version in range(current + 1, newest + 1)]


def parse_json_record(text: str | bytes | dict[str, Any]) -> dict[str, JSON]:
    """A stored ledger record (JSON text, or a dict already) as a dict; the ledger's ``decode_record`` then makes
    it the call's answer."""
    if isinstance(text, dict):
        return text
    value = json.loads(text)
    if not isinstance(value, dict):
        raise TypeError(f"ledger record is not a JSON object: {value!r}")
    return value
