"""Deliberately broken runtimes: each one breaks one promise of the ledger, the run loop or storage.

``apply(name)`` patches the runtime in this process (a conftest calls it from ``REPLAYSAFE_MUTANT``). The crash
matrix must report violation cells for every one of them (tests/test_mutants.py); a harness that passes a
mutant would pass that bug in a user's runtime too.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from tenxgraph.core.crashpoints import crash_point
from tenxgraph.core.graph import compiled
from tenxgraph.core.graph.utils import invoke_node_handler as handler
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer
from tenxgraph.storage.checkpointer.pg import PgCheckpointer

BACKENDS = (InMemoryCheckpointer, SqliteCheckpointer, PgCheckpointer)


def ledger_read_misses() -> None:
    async def read(batch: Any, calls: Any) -> dict[str, Any]:
        return {}

    handler._read_ledger = read


def record_before_run() -> None:
    original = handler._invoke

    async def invoke(batch: Any, call: Any, args: Any) -> Any:
        info = call.info
        assert info.key is not None
        record = {"v": 1, "kind": "value", "tool": info.tool, "call_id": info.call_id, "output": None}
        await batch.checkpointer.aput_tool_result(info.thread_id, info.key, record)
        return await original(batch, call, args)

    handler._invoke = invoke


def record_never_written() -> None:
    async def record(batch: Any, call: Any, execution: Any) -> Any:
        crash_point("ledger.write_error")
        crash_point("tool.after_record")
        return execution

    handler._record = record


def key_from_call_id_only() -> None:
    """The ledger is stored under tool_call_id alone: ``call_1`` of turn 2 finds ``call_1`` of turn 1."""

    def short(key: str) -> str:
        return key.split(":", 1)[-1]

    for cls in BACKENDS:

        def make(get: Callable[..., Any], put: Callable[..., Any]) -> tuple[Callable[..., Any], Callable[..., Any]]:
            async def get_results(self: Any, thread_id: str, keys: Any) -> dict[str, Any]:
                found = await get(self, thread_id, [short(k) for k in keys])
                return {k: found[short(k)] for k in keys if short(k) in found}

            async def put_result(self: Any, thread_id: str, key: str, record: Any) -> bool:
                return bool(await put(self, thread_id, short(key), record))

            return get_results, put_result

        cls.aget_tool_results, cls.aput_tool_result = make(cls.aget_tool_results, cls.aput_tool_result)  # type: ignore[method-assign]


def replay_first_record() -> None:
    original = handler._read_ledger

    async def read(batch: Any, calls: Any) -> dict[str, Any]:
        found = await original(batch, calls)
        first = next((found[c.key] for c in calls if c.key in found), None)
        return {k: first for k in found}

    handler._read_ledger = read


def unstable_idempotency_key() -> None:
    handler.ToolCallInfo.idempotency_key = property(lambda self: f"tenx-{uuid.uuid4().hex}")  # type: ignore[method-assign,assignment]


def node_not_persisted() -> None:
    async def start(self: Any, messages: Any, values: Any) -> None:
        for name, value in values.items():
            setattr(self.state, name, value)
        self.state.messages.extend(messages)
        self.seen.update(m.message_id for m in messages)
        self.state.meta.current_node = self.graph.entry_point
        self.state.meta.status = "running"  # ... and nothing is written until the first node has run

    compiled._Run.start = start  # type: ignore[method-assign]
    compiled._Run.stage = lambda self, messages, values: None  # type: ignore[method-assign]  # (nor staged)


def cas_disabled() -> None:
    for cls in BACKENDS:
        original = cls.aput_thread

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            async def put(
                self: Any, thread_id: str, values: Any, *, expected_version: int, new_messages: Any = ()
            ) -> int:
                snap = await self.aget_thread(thread_id)  # whatever is stored is what we "expected"
                current = snap.version if snap is not None else 0
                return int(await original(self, thread_id, values, expected_version=current, new_messages=new_messages))

            return put

        cls.aput_thread = make(original)  # type: ignore[method-assign]


def run_lock_disabled() -> None:
    @contextlib.asynccontextmanager
    async def no_lock(self: Any, thread_id: str) -> AsyncIterator[None]:
        yield

    for cls in BACKENDS:
        cls.arun_lock = no_lock  # type: ignore[method-assign]


def stale_redis_trusted() -> None:
    PgCheckpointer.aget_thread = PgCheckpointer.aget_cached_thread  # type: ignore[method-assign]


def first_parallel_call_only_recorded() -> None:
    original = handler._record

    async def record(batch: Any, call: Any, execution: Any) -> Any:
        if call.info.index > 0:
            crash_point("ledger.write_error")
            crash_point("tool.after_record")
            return execution
        return await original(batch, call, execution)

    handler._record = record


def ledger_read_prefix_only() -> None:
    """An "optimisation": replay stops at the first call (in message order) without a record. Only a crash that
    leaves a non-prefix set of siblings recorded shows it (see ``--crash-orders``)."""
    original = handler._read_ledger

    async def read(batch: Any, calls: Any) -> dict[str, Any]:
        found = await original(batch, calls)
        prefix: dict[str, Any] = {}
        for key in dict.fromkeys(c.key for c in calls):
            if key not in found:
                break
            prefix[key] = found[key]
        return prefix

    handler._read_ledger = read


def replay_consumes_records() -> None:
    """Replay *moves* records: the ledger read deletes what it found (a consume-once queue) and the tool node
    writes them back once its calls are done. One crash and a clean resume never show it; a crash during that
    resume, after the read and before the write-back, loses the records, and the next resume runs recorded calls
    again (see ``--crash-depth=2``)."""
    from tenxgraph.core.graph import tool_node

    original_read, original_invoke = handler._read_ledger, tool_node.invoke_tool_calls
    consumed: dict[str, dict[str, Any]] = {}

    async def read(batch: Any, calls: Any) -> dict[str, Any]:
        found = await original_read(batch, calls)
        store = batch.checkpointer
        while hasattr(store, "inner"):
            store = store.inner
        if found and isinstance(store, SqliteCheckpointer):
            with store._tx() as conn:
                rows = [(batch.thread_id, key) for key in found]
                conn.executemany("DELETE FROM tool_executions WHERE thread_id = ? AND key = ?", rows)
            consumed.setdefault(batch.thread_id, {}).update(found)
        return found

    async def invoke(message: Any, tools: Any, checkpointer: Any, thread_id: str, **options: Any) -> Any:
        executions = await original_invoke(message, tools, checkpointer, thread_id, **options)
        back = consumed.pop(thread_id, {})
        if back:
            await checkpointer.aput_tool_results(thread_id, list(back.items()))
        return executions

    handler._read_ledger = read
    tool_node.invoke_tool_calls = invoke  # type: ignore[assignment]


def dead_connections_reused() -> None:
    """The PostgreSQL checkpointer as it was before the drop fault found it: after the server dropped its
    connections, the pool keeps handing out the dead idle ones (no check after a lost connection) and taking the
    run lock is not retried, so runs and resumes fail until every dead connection has been tried."""
    from psycopg_pool import AsyncConnectionPool

    from tenxgraph.storage.checkpointer import pg_connect
    from tenxgraph.storage.checkpointer.pg_run_lock import PgRunLocks

    pg_connect.is_connection_lost = lambda exc: False

    async def take(self: Any, pool: AsyncConnectionPool, stack: Any, lease: Any, reads: Any) -> Any:
        import time

        from tenxgraph.storage.checkpointer.pg_lease import Holder

        conn = await stack.enter_async_context(pool.connection(timeout=self.host.connect_timeout))
        params = self._claim_params(lease)
        async with conn.pipeline():
            locked = await conn.execute(self.q["claim_lease"], params)
            fetch = await reads(conn, lease.owner)
        row = await locked.fetchone()
        if row is not None and row[0] and not row[1]:  # (a killed holder's lease, as the real one does)
            row = await self._take_from_dead(conn, lease, params, Holder.from_row(row[2:]), row)
        if not row or not row[0] or not row[1]:
            from tenxgraph.errors import ThreadBusyError

            raise ThreadBusyError(lease.thread_id)
        lease.confirm(time.monotonic(), self.host.run_lease)
        return conn, await fetch()

    async def reclaim(self: Any, thread_id: str, what: str, cause: Any) -> Any:
        from tenxgraph.errors import RunLockLostError

        raise RunLockLostError(thread_id, f"its connection failed during {what}")  # (it predates the lease)

    async def release(self: Any, conn: Any, lease: Any) -> None:
        with contextlib.suppress(Exception):  # (the connection died: so did its lock; its lease runs out)
            async with conn.pipeline():
                await conn.execute(self.q["release_lease"], (lease.thread_id, lease.owner))
                await conn.execute(self.q["unlock"], (lease.key,))

    PgRunLocks._take_lock = take  # type: ignore[method-assign]
    PgRunLocks._reclaim = reclaim  # type: ignore[method-assign]
    PgRunLocks._release = release  # type: ignore[method-assign]


def lease_ignored() -> None:
    """The run lease is not enforced: a run that gets the advisory lock takes the thread whoever holds its lease
    (every holder counts as dead), so a worker arriving while the lock connection of a live run is gone takes the
    thread and runs again what that run has in flight."""
    from tenxgraph.storage.checkpointer import pg_lease

    pg_lease.Holder.dead = lambda self, me: True  # type: ignore[method-assign]


def lease_not_renewed() -> None:
    """The run lease is never renewed: it runs out while its run still works, and a worker arriving later takes
    the thread and runs again the call in flight."""
    from tenxgraph.storage.checkpointer import pg_lease

    pg_lease.Renewer.renew = lambda self, leases: True  # type: ignore[method-assign]


def no_retries() -> None:
    """PostgreSQL statements are never retried, the run lock's reclaim neither: a short outage fails the run,
    and its resume too."""
    from tenxgraph.storage.checkpointer.pg_run_lock import PgRunLocks

    original = PgCheckpointer.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **{**kwargs, "retries": 0})

    async def reclaim(self: Any, thread_id: str, what: str, cause: Any) -> Any:
        from tenxgraph.errors import RunLockLostError

        raise RunLockLostError(thread_id, f"its connection failed during {what} (not retried)")

    PgCheckpointer.__init__ = init  # type: ignore[method-assign]
    PgRunLocks._reclaim = reclaim  # type: ignore[method-assign]


def cache_errors_raised() -> None:
    """The cache is written inline after every state write, and a Redis failure fails the run instead of leaving
    the cache behind (PostgreSQL is the truth; the cache only an optimisation)."""
    import json

    original = PgCheckpointer.aput_thread

    async def aput_thread(self: Any, thread_id: str, values: Any, *, expected_version: int, **kw: Any) -> int:
        version = await original(self, thread_id, values, expected_version=expected_version, **kw)
        if self._cache is not None:
            import redis.asyncio as aioredis

            client = aioredis.from_url(self.redis_url, socket_connect_timeout=0.5, socket_timeout=0.5)
            try:
                state = {"version": version, "state": json.dumps(values)}
                await client.hset(self.cache_key(thread_id), mapping=state)  # type: ignore[misc]
            finally:
                await client.aclose()
        return version

    PgCheckpointer.aput_thread = aput_thread  # type: ignore[method-assign]


def intent_failure_ignored() -> None:
    """A tool with an in-doubt policy runs although its intent record could not be written (logged only), so a
    refused record write after it goes undetected and the resume runs it again silently."""
    original = handler.write_intent

    async def write_intent(call: Any, checkpointer: Any) -> None:
        with contextlib.suppress(Exception):
            await original(call, checkpointer)

    handler.write_intent = write_intent


def intents_not_written() -> None:
    """In-doubt detection broken: no intent is written, so a tool with a policy is re-run silently after a crash."""

    async def skip(batch: Any, to_run: Any) -> None:
        return None

    handler._write_intents = skip


def ledger_read_failure_runs_everything() -> None:
    """A failed ledger read runs every call, those of tools with an in-doubt policy too (blind)."""
    original = handler._read_ledger

    async def read(batch: Any, calls: Any) -> dict[str, Any]:
        import dataclasses

        return await original(batch, [dataclasses.replace(c, tool=None) for c in calls])  # as if no tool had a policy

    handler._read_ledger = read


def group_commit_one_output() -> None:
    """A group commit stores the first record's output for every call of the group: only a crash after calls that
    returned together, and a replay of them, shows it (every record of a group held to its own call)."""
    for cls in BACKENDS:

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            async def put(self: Any, thread_id: str, records: Any) -> Any:
                first = records[0][1].get("output")
                return await original(self, thread_id, [(k, {**r, "output": first}) for k, r in records])

            return put

        cls.aput_tool_results = make(cls.aput_tool_results)  # type: ignore[method-assign]


def replayed_error_as_success() -> None:
    """A replayed record loses its error flag: after a crash the model is told a failed call succeeded."""
    import dataclasses

    original = handler.decode_record

    def decode(call: Any, key: str, record: Any) -> Any:
        execution = original(call, key, record)
        result = dataclasses.replace(execution.result, is_error=False, status="success")
        return dataclasses.replace(execution, result=result)

    handler.decode_record = decode


def lock_released_before_last_write() -> None:
    """SQLite's run lock is released at the run loop's hint that the last write comes next, not after that write:
    another run can take the thread while its final state is not stored yet (one write too early)."""
    import fcntl
    import hashlib
    import os
    import struct

    from tenxgraph.errors import ThreadBusyError
    from tenxgraph.storage.checkpointer import sqlite_lock

    held: dict[tuple[int, str], tuple[int, int]] = {}  # (checkpointer, thread) -> (descriptor, byte)

    @contextlib.asynccontextmanager
    async def arun_lock(self: Any, thread_id: str) -> AsyncIterator[None]:
        offset = int.from_bytes(hashlib.sha256(thread_id.encode()).digest()[:8]) >> 2
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                sqlite_lock.lock_byte(fd, offset)
            except (BlockingIOError, PermissionError):
                raise ThreadBusyError(thread_id) from None
            held[(id(self), thread_id)] = (fd, offset)
            yield
        finally:
            held.pop((id(self), thread_id), None)
            os.close(fd)

    def release_early(self: Any, thread_id: str) -> None:
        found = held.pop((id(self), thread_id), None)
        if found is not None and sqlite_lock.OFD_SETLK is not None:
            fd, offset = found
            fcntl.fcntl(fd, sqlite_lock.OFD_SETLK, struct.pack("@hhqqi4x", fcntl.F_UNLCK, os.SEEK_SET, offset, 1, 0))

    SqliteCheckpointer.arun_lock = arun_lock  # type: ignore[method-assign,assignment]
    SqliteCheckpointer.release_lock_with_next_write = release_early  # type: ignore[method-assign]


def recovery_ignores_live_lock() -> None:
    """The recovery sweep takes a thread whose status says running for abandoned and resumes it without its run
    lock, while a live run holds that lock (only recovery as the resume path, contested, shows it)."""
    from tenxgraph.server import recovery
    from tenxgraph.storage.checkpointer.delegating import DelegatingCheckpointer

    class Unlocked(DelegatingCheckpointer):
        @contextlib.asynccontextmanager
        async def arun_lock(self, thread_id: str) -> AsyncIterator[None]:
            yield

        async def acheck_run_lock(self, thread_id: str) -> None:
            return None

    original = recovery.Recovery.recover

    async def recover(self: Any, thread_id: str) -> str:
        self.graph = self.graph.copy(Unlocked(self.graph.checkpointer))
        return await original(self, thread_id)

    recovery.Recovery.recover = recover  # type: ignore[method-assign]


def prune_deletes_resumable() -> None:
    """The retention job deletes the records of interrupted threads too (as if include_resumable were given): only
    a prune between a crash and its resume shows it."""
    for cls in BACKENDS:

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            async def prune(self: Any, older_than: Any, *, include_resumable: bool = False, **kw: Any) -> int:
                return int(await original(self, older_than, include_resumable=True, **kw))

            return prune

        cls.aprune_tool_executions = make(cls.aprune_tool_executions)  # type: ignore[method-assign]


def idempotency_key_without_message_id() -> None:
    """The idempotency key is derived from the thread and tool_call_id alone: ``call_1`` of the second turn gets the
    key of ``call_1`` of the first, and a provider drops it as a duplicate."""
    import hashlib

    def key(self: Any) -> str:
        return "tenx-" + hashlib.sha256(f"{self.thread_id}\x00{self.call_id}".encode()).hexdigest()[:40]

    handler.ToolCallInfo.idempotency_key = property(key)  # type: ignore[method-assign,assignment]


def ledger_read_rides_on_write() -> None:
    """The tool node's ledger read is answered from a read made in the round trip of the state write before it (the
    write that adds the assistant message, or a Resume's status write): a saved round trip that crosses the points
    where the thread may change hands, so a run that took the thread over meanwhile has its records hidden (the
    duplicate the crash matrix found on main: issue #48)."""
    original_write = compiled._Run._write
    original_read = handler._read_ledger
    early: dict[str, tuple[set[str], dict[str, Any]]] = {}

    async def write(self: Any, messages: Any) -> None:
        await original_write(self, messages)
        message = self.state.last_assistant
        keys = [k for k in handler.call_keys(message) if k] if message is not None and message.tool_calls else []
        if keys:
            tid = self.cfg.thread_id
            early[tid] = (set(keys), await self.graph.checkpointer.aget_tool_results(tid, keys))

    async def read(batch: Any, calls: Any) -> dict[str, Any]:
        keys = {k for c in calls for k in (c.key, c.intent_key) if k is not None}
        found = early.pop(batch.thread_id, None)
        if found is not None and keys and keys <= found[0]:
            return {k: v for k, v in found[1].items() if k in keys}
        return await original_read(batch, calls)

    compiled._Run._write = write  # type: ignore[method-assign]
    handler._read_ledger = read


def resume_raises_unrelated() -> None:
    """A resume fails with an error unrelated to replay safety (an AttributeError as the run resumes): no promise
    is broken, but no thread can be finished after a crash. Its cells are ``resume_failed``, not violations."""
    original = compiled.emit_event

    def emit(name: str, *args: Any, **kwargs: Any) -> None:
        if name == "run_resumed":
            raise AttributeError("'NoneType' object has no attribute 'resume_hint'")
        original(name, *args, **kwargs)

    compiled.emit_event = emit  # type: ignore[assignment]


# -- a runtime whose account of a call differs from what the tool declares or its body did (judge.witnessed) --------
def declared_policy_ignored() -> None:
    """The tool node drops each tool's declared in-doubt policy (``@tool(on_in_doubt=...)``): no intent, no
    detection, and the runtime's events say the call had none, so a verdict reading them sees nothing to police."""
    from tenxgraph.core.graph import tool_node

    original = tool_node.invoke_tool_calls

    async def invoke(message: Any, tools: Any, *args: Any, **kwargs: Any) -> Any:
        plain = {n: replace(t, on_in_doubt=None) if t.on_in_doubt not in (None, "off") else t for n, t in tools.items()}
        return await original(message, plain, *args, **kwargs)

    tool_node.invoke_tool_calls = invoke  # type: ignore[assignment]


def tool_error_reported_as_success() -> None:
    """A tool that raised is answered, recorded and reported to observers as a success: every account the runtime
    gives agrees with itself, and the model is told a failed fraud check passed."""
    from tenxgraph.core.graph.utils.ledger_record import ToolResultBlock

    original = handler.notify

    def notify(kind: str, info: Any, output: object = None, is_error: bool = False, **kwargs: Any) -> None:
        original(kind, info, output, False, **kwargs)

    def error_execution(call: Any, key: Any, text: str, status: str = "error") -> Any:
        return handler.ToolExecution(call, key, ToolResultBlock(call.id, text))

    handler.notify = notify  # type: ignore[assignment]
    handler.error_execution = error_execution


def body_given_unreported_key() -> None:
    """The body is given a fresh idempotency key at every attempt while the runtime reports the call's stable one:
    the provider sees a new key after a crash and applies the effect again."""
    from tenxgraph.core.tools.tool import Tool

    original = Tool.injected_args

    def injected(self: Any, info: Any) -> dict[str, Any]:
        args = original(self, info)
        return {p: f"tenx-{uuid.uuid4().hex}" if p == "idempotency_key" else v for p, v in args.items()}

    Tool.injected_args = injected  # type: ignore[method-assign]


MUTANTS: dict[str, Callable[[], None]] = {
    f.__name__: f
    for f in (
        ledger_read_misses,
        record_before_run,
        record_never_written,
        key_from_call_id_only,
        replay_first_record,
        unstable_idempotency_key,
        node_not_persisted,
        cas_disabled,
        run_lock_disabled,
        stale_redis_trusted,
        first_parallel_call_only_recorded,
        ledger_read_prefix_only,
        replay_consumes_records,
        dead_connections_reused,
        lease_ignored,
        lease_not_renewed,
        no_retries,
        cache_errors_raised,
        intent_failure_ignored,
        intents_not_written,
        ledger_read_failure_runs_everything,
        group_commit_one_output,
        replayed_error_as_success,
        lock_released_before_last_write,
        recovery_ignores_live_lock,
        prune_deletes_resumable,
        idempotency_key_without_message_id,
        resume_raises_unrelated,
        ledger_read_rides_on_write,
        declared_policy_ignored,
        tool_error_reported_as_success,
        body_given_unreported_key,
    )
}
#: Mutants that need a dimension beyond one crash in one seeded order to be seen for sure.
NEEDS_ORDERS = frozenset({"ledger_read_prefix_only"})
#: Mutants only a crash during recovery shows (``--crash-depth=2``).
NEEDS_DEPTH = frozenset({"replay_consumes_records"})
#: Mutants only the drop fault shows (``--crash-faults=drop``, on PostgreSQL).
NEEDS_DROP = frozenset({"dead_connections_reused", "lease_ignored", "lease_not_renewed"})
#: Mutants only a storage outage shows: the fault (and its mode) each needs, and the backend.
NEEDS_OUTAGE = {
    "no_retries": ("outage", "postgres"),
    "cache_errors_raised": ("redis-down", "postgres+redis"),
    "intent_failure_ignored": ("readonly", "sqlite"),
}
#: Mutants that only a backend with a Redis cache can show.
NEEDS_REDIS = frozenset({"stale_redis_trusted"})


def transactional_commits_early() -> None:
    """A transactional tool's writes commit as soon as its body returns, before its ledger record: a crash between
    the two leaves the writes without the record, and the resumed call writes them again."""
    import dataclasses

    original = handler.run_transactional

    async def run(call: Any, args: Any, checkpointer: Any, timeout: Any) -> Any:
        fn = call.tool.fn

        def early(**kwargs: Any) -> Any:
            value = fn(**kwargs)
            kwargs["tx"].execute("COMMIT")
            kwargs["tx"].execute("BEGIN IMMEDIATE")
            return value

        early_call = dataclasses.replace(call, tool=dataclasses.replace(call.tool, fn=early))
        return await original(early_call, args, checkpointer, timeout)

    handler.run_transactional = run


def decisions_not_read_back() -> None:
    """A resumed run does not read the recorded decisions back: it asks the person again."""

    async def load(checkpointer: Any, thread_id: str, ids: Any) -> dict[str, Any]:
        return {}

    compiled.load_decisions = load


def approved_call_runs_again() -> None:
    """Once a call is approved, the ledger runs it without looking at its record (an approval treated as an order
    to run, not as a permission)."""
    from tenxgraph.core.tools.context import current_run
    from tenxgraph.core.tools.interrupts import approval_id

    original = handler._read_ledger

    async def read(batch: Any, calls: Any) -> dict[str, Any]:
        found = await original(batch, calls)
        run = current_run()
        decisions = run.pauses.decisions if run is not None else {}
        for call in calls:
            tool = call.tool
            if tool is not None and approval_id(call.info.execution_id, tool.parse_args(call.block.args)) in decisions:
                found.pop(call.key, None)
        return found

    handler._read_ledger = read


def rejection_reason_approves() -> None:
    """A rejection with a reason (a string) is taken for a yes: only False rejects."""
    from tenxgraph.core.graph.utils import approvals

    approvals.is_approved = lambda value: value is not False


def decision_not_recorded() -> None:
    """A Resume's decisions are acted on, but kept in memory only: nothing durable says what the person decided."""
    from tenxgraph.core.graph import pauses

    async def record(checkpointer: Any, thread_id: str, resume: Any, asked: Any, decided: Any) -> dict[str, Any]:
        new = pauses._check(resume, asked, decided, thread_id)
        decided.update(new)
        return new

    compiled.record_decisions = record


def second_decision_wins() -> None:
    """A Resume with a different decision for an interrupt already decided is taken (the last answer wins) instead
    of refused: the run acts on an answer that the record does not hold and the person who decided never gave."""
    from tenxgraph.core.graph import pauses
    from tenxgraph.core.tools.interrupts import Resume

    original = pauses.record_decisions

    async def record(checkpointer: Any, thread_id: str, resume: Any, asked: Any, decided: Any) -> dict[str, Any]:
        changed = {i: v for i, v in resume.decisions.items() if i in decided and decided[i] != v}
        decided.update(changed)
        rest = {i: v for i, v in resume.decisions.items() if i not in changed}
        return {**changed, **(await original(checkpointer, thread_id, Resume(rest), asked, decided) if rest else {})}

    compiled.record_decisions = record


def batch_runs_while_waiting() -> None:
    """The calls of a batch that need no approval run (and are recorded) while a sibling waits for its approval:
    the email saying "refunded" goes out before a person approved the refund."""
    held: list[Any] = []
    check, gather = handler.check_approvals, handler.gather_calls

    def check_approvals(calls: Any, pauses: Any, node: Any) -> Any:
        held.clear()  # (a crash may have cut the batch before it paused)
        out = check(calls, pauses, node)
        if out.waiting and out.runnable:
            held.append(handler.GraphInterrupt(out.waiting))
            out.waiting = []
        return out

    async def gather_calls(futures: Any) -> Any:
        ran = await gather(futures)
        return [*ran, held.pop()] if held else ran  # the batch pauses once the others ran

    handler.check_approvals = check_approvals
    handler.gather_calls = gather_calls


#: Mutants of approvals: caught over examples/approved_refund (tests/test_approvals_gate.py), each for its reason.
APPROVAL_MUTANTS: dict[str, Callable[[], None]] = {
    "decisions_not_read_back": decisions_not_read_back,
    "approved_call_runs_again": approved_call_runs_again,
    "rejection_reason_approves": rejection_reason_approves,
    "decision_not_recorded": decision_not_recorded,
    "second_decision_wins": second_decision_wins,
    "batch_runs_while_waiting": batch_runs_while_waiting,
}


def mcp_hints_trusted_as_read() -> None:
    """Every MCP tool is taken for read-only (a client that trusts a missing or wrong hint): nothing is recorded."""
    from tenxgraph.core.tools.effects import Effect
    from tenxgraph.integrations.mcp import tools

    tools.effect_of = lambda annotations, trusted=True: Effect.READ


def mcp_key_not_sent() -> None:
    """The call's idempotency key is not sent in the request's ``_meta``: the server cannot deduplicate a re-run."""
    from tenxgraph.integrations.mcp.session import MCPSession

    original = MCPSession.acall_tool

    async def call(self: Any, name: str, arguments: Any, meta: Any) -> Any:
        return await original(self, name, arguments, {})

    MCPSession.acall_tool = call  # type: ignore[method-assign]


def mcp_external_retried() -> None:
    """An MCP write that is not idempotent is run again when found in doubt (policy retry, not fail)."""
    from tenxgraph.integrations.mcp import tools

    original = tools.to_tool

    def to_tool(session: Any, listed: Any, options: Any) -> Any:
        made = original(session, listed, options)
        return made if made.policy is None else replace(made, on_in_doubt="retry")

    tools.to_tool = to_tool


def mcp_error_taken_for_success() -> None:
    """A result the server marked ``isError`` reaches the model and the ledger as a success."""
    from tenxgraph.core.tools.tool import ToolOutput
    from tenxgraph.integrations.mcp import tools

    original = tools.output_of

    def output_of(result: Any) -> Any:
        return ToolOutput(original(result).content, is_error=False)

    tools.output_of = output_of


#: Mutants of the MCP integration: caught over examples/mcp_tools and an agent whose call fails on its server
#: (tests/test_mcp_gate.py), by the verdict's own findings, each for its reason.
MCP_MUTANTS: dict[str, Callable[[], None]] = {
    "mcp_hints_trusted_as_read": mcp_hints_trusted_as_read,
    "mcp_key_not_sent": mcp_key_not_sent,
    "mcp_external_retried": mcp_external_retried,
    "mcp_error_taken_for_success": mcp_error_taken_for_success,
}


#: Mutants of transactional tools: caught over an agent that has one (tests/test_transactional.py).
TRANSACTIONAL_MUTANTS: dict[str, Callable[[], None]] = {"transactional_commits_early": transactional_commits_early}


# -- streaming: what a UI is told while the run goes (stream_mode="messages") ---------------------------------------
def stream_replayed_as_fresh() -> None:
    """Every streamed tool result says it ran just now: after a crash, a UI shows a refund the ledger replayed as
    a second refund."""
    from tenxgraph.core.tools.observe import RunObserver

    original = RunObserver.message

    def message(self: Any, message: Any, replayed: bool | None = None) -> None:
        original(self, message, False if replayed else replayed)

    RunObserver.message = message  # type: ignore[method-assign]


def stream_recorded_as_replayed() -> None:
    """The streamed flag says whether the result is *recorded*, not whether it was *replayed*: every call that just
    ran and was recorded reaches the UI as if the ledger had answered it (a refund shown as not done again)."""
    from tenxgraph.core.graph.utils import watch

    original = watch.report

    def report(observer: Any, info: Any, execution: Any, traced: Any = None) -> None:
        original(observer, info, replace(execution, replayed=execution.recorded), traced)

    handler.report = report  # type: ignore[attr-defined]


def stream_error_as_success() -> None:
    """Every streamed tool result says it succeeded: a UI shows a failed refund as done (the stored one says
    error)."""
    from tenxgraph.core.tools.observe import RunObserver
    from tenxgraph.state.messages import ToolResultBlock

    original = RunObserver.message

    def message(self: Any, message: Any, replayed: bool | None = None) -> None:
        blocks = [replace(b, is_error=False) if isinstance(b, ToolResultBlock) else b for b in message.content]
        original(self, replace(message, content=tuple(blocks)), replayed)

    RunObserver.message = message  # type: ignore[method-assign]


STREAM_MUTANTS: dict[str, Callable[[], None]] = {
    "stream_replayed_as_fresh": stream_replayed_as_fresh,
    "stream_recorded_as_replayed": stream_recorded_as_replayed,
    "stream_error_as_success": stream_error_as_success,
}


def apply(name: str | None) -> None:
    if name:
        {**MUTANTS, **TRANSACTIONAL_MUTANTS, **APPROVAL_MUTANTS, **MCP_MUTANTS, **STREAM_MUTANTS}[name]()
