"""PgCheckpointer's run locks: a session advisory lock on a connection held for the run, and the thread's lease
(:mod:`.pg_lease`), claimed in the same statement, with the run's first reads pipelined behind it; the lock taken
again on a new connection after a blip while the lease is still the run's (:meth:`PgRunLocks._reclaim`); the
fencing check; and the release, pipelined behind the run's last write or on its own.

One :class:`PgRunLocks` per checkpointer, made again in a forked child. It reaches its checkpointer (*host*) for
the pool, the SQL, the settings and the retry rules: the checkpointer owns those, this module the locks."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Protocol, TypeAlias, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

import tenxgraph.storage.checkpointer.pg_connect as pg_connect
from tenxgraph.storage.checkpointer.holders import LIVE_OWNERS, warn_taken_over
from tenxgraph.storage.checkpointer.pg_lease import Holder, Lease, Process, Renewer
from tenxgraph.storage.checkpointer.pg_pool import PgPool
from tenxgraph.utils.constants import LOGGER_NAME
from tenxgraph.utils.errors import ConfigError, RunLockLostError, StorageConnectionError, ThreadBusyError

log = logging.getLogger(LOGGER_NAME)
T = TypeVar("T")
R = TypeVar("R")
#: Queue statements on a connection in pipeline mode (given it and the lease's owner: a write among them can be
#: made conditional on the claim); the returned coroutine function fetches their results.
QueueReads: TypeAlias = Callable[[psycopg.AsyncConnection[Any], str], Awaitable[Callable[[], Awaitable[R]]]]


def advisory_key(schema: str, thread_id: str) -> int:
    """The 64-bit advisory-lock key of *thread_id* in *schema* (a 32-bit hash made unrelated threads collide:
    ``order-3687`` and ``order-118181``; 64 bits make a collision among locks held at once negligible)."""
    digest = hashlib.blake2b(f"{schema}\x00{thread_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class LockHost(Protocol):
    """What the run locks use of their checkpointer (:class:`.pg.PgCheckpointer`): its SQL, settings, pool and
    retry rules."""

    _q: dict[str, str]
    postgres_dsn: str | None
    run_lease: float
    retries: int
    connect_timeout: float
    lease_host: str | None

    async def _ensure_open(self) -> AsyncConnectionPool: ...

    async def _retrying(self, what: str, op: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T: ...

    @property
    def _pool(self) -> PgPool: ...


class NotHeld:
    """What :meth:`PgRunLocks.run` answers when this process holds no lock on the thread (use the pool)."""


NOT_HELD = NotHeld()


class PgRunLocks:
    def __init__(self, host: LockHost) -> None:
        self.host = host
        self.q = host._q
        self.conns: dict[str, psycopg.AsyncConnection[Any]] = {}  # run locks held by this process
        # One statement (or pipeline) at a time on a lock's connection: the run and any other reader of its thread
        # in this process (a server's state endpoint) share it, and a pipeline must not take in a stranger's query.
        self.guards: dict[str, asyncio.Lock] = {}
        self.stacks: dict[str, AsyncExitStack] = {}  # what keeps each lock's connections (a reclaim adds one)
        self.leases: dict[str, Lease] = {}
        # Threads whose next state write is their run's last: "pending", then "released" once the unlock went
        # in the same round trip as that write (see release_with_next_write).
        self.unlock_with_write: dict[str, str] = {}
        self.renewer: Renewer | None = None

    def close(self) -> None:
        if self.renewer is not None:
            self.renewer.close()
            self.renewer = None

    @asynccontextmanager
    async def hold(self, pool: AsyncConnectionPool, thread_id: str, key: int, reads: QueueReads[R]) -> AsyncIterator[R]:
        """Hold *thread_id*'s lock and lease for a run; yields what *reads* read in the lock's round trip."""
        lease = Lease(thread_id, key)
        async with AsyncExitStack() as stack:
            conn, read = await self._take_lock(pool, stack, lease, reads)
            guard = self.guards[thread_id] = asyncio.Lock()
            self.conns[thread_id], self.stacks[thread_id], self.leases[thread_id] = conn, stack, lease
            self._renewer_for(pool).add(lease)
            LIVE_OWNERS.add(lease.owner)
            try:
                yield read
            finally:
                LIVE_OWNERS.discard(lease.owner)
                async with guard:  # a reader on this connection finishes first; later ones go to the pool
                    self._renewer_for(pool).remove(lease)
                    conn = self.conns.pop(thread_id, conn)
                    for held in (self.guards, self.stacks, self.leases):
                        held.pop(thread_id, None)
                    if self.unlock_with_write.pop(thread_id, None) != "released":  # not behind the last write
                        await self._release(conn, lease)

    async def run(
        self, thread_id: str, what: str, op: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]
    ) -> T | NotHeld:
        """Run *op* on the connection holding *thread_id*'s run lock (if it dies, the lock is taken again on a new
        one while the lease is still this run's, and *op* runs again there; else :class:`RunLockLostError`), or
        :data:`NOT_HELD` when this process holds no lock on the thread."""
        guard = self.guards.get(thread_id)
        if guard is not None:
            async with guard:
                while (conn := self.conns.get(thread_id)) is not None:  # (None: the run ended meanwhile)
                    try:
                        return await op(conn)
                    except psycopg.OperationalError as exc:
                        if not (conn.broken or conn.closed):
                            raise
                        await self._reclaim(thread_id, f"the {what}", exc)  # (or RunLockLostError: the run stops)
        return NOT_HELD

    def last_write_releases(self, thread_id: str, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Whether a state write on *conn* is the run's last, to be sent with the release (see
        :meth:`write_and_release`)."""
        return self.unlock_with_write.get(thread_id) == "pending" and conn is self.conns.get(thread_id)

    async def write_and_release(
        self, conn: psycopg.AsyncConnection[Any], thread_id: str, query: str, params: Any
    ) -> psycopg.AsyncCursor[Any]:
        """One round trip: the write, the lease's release in its transaction, the commit, then the advisory lock's
        release. The explicit COMMIT matters: a pipeline's statements share one implicit transaction until its
        sync, so without it the lock would be free before the write committed, and the next run could read the
        state before it."""
        lease = self.leases[thread_id]
        if self.renewer is not None:
            self.renewer.remove(lease)  # (a renewal must not find the row gone and call the run lost)
        async with conn.pipeline():
            await conn.execute("BEGIN")
            cur = await conn.execute(query, params)
            await conn.execute(self.q["release_lease"], (thread_id, lease.owner))
            await conn.execute("COMMIT")
            await conn.execute(self.q["unlock"], (lease.key,))
        self.unlock_with_write[thread_id] = "released"
        return cur

    def _renewer_for(self, pool: AsyncConnectionPool) -> Renewer:
        """The renewer of this process's leases (made on first use), on a connection of its own to the pool's
        server."""
        if self.renewer is None:
            conninfo = self.host.postgres_dsn or (pool.conninfo if isinstance(pool.conninfo, str) else None)
            if conninfo is None:
                raise ConfigError(
                    "PgCheckpointer(pool=...) needs a pool whose conninfo is a string: run leases are renewed on a "
                    "connection of their own; pass such a pool, or postgres_dsn="
                )
            given = pool.kwargs if isinstance(pool.kwargs, dict) else {}
            kwargs = {k: v for k, v in given.items() if k != "autocommit"}
            query = self.q["renew_leases"]
            self.renewer = Renewer(conninfo, kwargs, query, self.host.run_lease, self.host.connect_timeout)
        return self.renewer

    def _process(self) -> Process:
        return Process.current(self.host.lease_host)

    async def _release(self, conn: psycopg.AsyncConnection[Any], lease: Lease) -> None:
        """The lease's row, then the advisory lock, in one round trip; the row through the pool if the lock's
        connection is gone (its lock went with it), so that the next run need not wait for the lease to run out."""
        if not (conn.broken or conn.closed):
            try:
                async with conn.pipeline():
                    await conn.execute(self.q["release_lease"], (lease.thread_id, lease.owner))
                    await conn.execute(self.q["unlock"], (lease.key,))
                return
            except psycopg.Error as exc:  # the connection died: so did its lock; the row is deleted below
                log.warning(
                    "releasing the run lock of thread %r failed (%s); releasing its lease", lease.thread_id, exc
                )

        async def op(other: psycopg.AsyncConnection[Any]) -> None:
            await other.execute(self.q["release_lease"], (lease.thread_id, lease.owner))

        try:
            await self.host._retrying("run lease release", op)
        except (psycopg.Error, StorageConnectionError) as exc:
            log.warning(
                "thread %r: its run lease could not be released (%s); another run may take the thread when it runs "
                "out, within %g s",
                lease.thread_id,
                exc,
                self.host.run_lease,
            )

    def _claim_params(self, lease: Lease) -> dict[str, Any]:
        me = self._process()
        return {
            "key": lease.key, "t": lease.thread_id, "owner": lease.owner, "host": me.host, "pid": me.pid,
            "start": me.start, "lease": self.host.run_lease,
        }  # fmt: skip

    async def _take_lock(
        self, pool: AsyncConnectionPool, stack: AsyncExitStack, lease: Lease, reads: QueueReads[R]
    ) -> tuple[psycopg.AsyncConnection[Any], R]:
        """The run lock and lease on a pooled connection (kept open by *stack*), and the run's first reads
        (*reads* queues them behind the claim), in one round trip. Retried on a lost connection: a lock taken on a
        connection that then died went with it (and the lease is this run's own)."""
        thread_id, params = lease.thread_id, self._claim_params(lease)
        delays = pg_connect.RETRY_BACKOFF.delays()
        for attempt in range(self.host.retries + 1):
            attempt_stack = AsyncExitStack()
            sent = time.monotonic()
            try:
                conn = await attempt_stack.enter_async_context(pool.connection(timeout=self.host.connect_timeout))
                async with conn.pipeline():  # one round trip: the lock, then (statements later) what the run reads
                    claimed = await conn.execute(self.q["claim_lease"], params)
                    fetch = await reads(conn, lease.owner)
                row = await claimed.fetchone()
                read = await fetch()
                if row is not None and row[0] and not row[1]:
                    row = await self._take_from_dead(conn, lease, params, Holder.from_row(row[2:]), row)
            except (psycopg.OperationalError, PoolTimeout) as exc:
                await attempt_stack.__aexit__(type(exc), exc, exc.__traceback__)
                if not pg_connect.is_transient(exc):
                    raise
                await self.host._pool.before_retry(pool, "run lock", exc, attempt, next(delays))
                continue
            except BaseException as exc:
                await attempt_stack.__aexit__(type(exc), exc, exc.__traceback__)
                raise
            stack.push_async_exit(attempt_stack)
            if not row or not row[0]:
                raise ThreadBusyError(thread_id)
            lease.confirm(sent, self.host.run_lease)
            previous = Holder.from_row(row[2:])
            if previous is not None and previous.owner != lease.owner and previous.live is False:
                why = f"whose lease ran out {-previous.left_s:.1f} s ago without being released"
                warn_taken_over(thread_id, previous, self._process(), why)
            return conn, read
        raise AssertionError("unreachable")

    async def _take_from_dead(
        self, conn: psycopg.AsyncConnection[Any], lease: Lease, params: dict[str, Any], holder: Holder | None, row: Any
    ) -> Any:
        """The advisory lock was granted but the lease is another run's and has not run out: take it if its holder
        is known dead (a process of this host that is gone), else let the lock go and refuse the thread."""
        me = self._process()
        if holder is not None and holder.dead(me):
            taken = await conn.execute(self.q["take_lease"], {**params, "from": holder.owner})
            if await taken.fetchone() is not None:
                warn_taken_over(lease.thread_id, holder, me, "whose process is gone")
                return (True, True, *row[2:])
        await conn.execute(self.q["unlock"], (lease.key,))
        if holder is None:  # (released between the lock and the claim: another attempt will find it free)
            raise ThreadBusyError(lease.thread_id)
        raise ThreadBusyError(lease.thread_id, holder=holder.describe(me), retry_after=max(holder.left_s, 0.0))

    async def _reclaim(self, thread_id: str, what: str, cause: BaseException | None) -> psycopg.AsyncConnection[Any]:
        """The lock connection died during *what*: take the advisory lock again on a new connection, and extend
        the lease, if it is still this run's (tried with back-off while the lease lasts, and as long again: the
        compare on the owner decides). Else the run has lost the thread: :class:`RunLockLostError`."""
        lease = self.leases[thread_id]
        if lease.lost is not None:
            raise RunLockLostError(thread_id, lease.lost)
        pool = await self.host._ensure_open()
        params = self._claim_params(lease)
        deadline = max(lease.confirmed_until, time.monotonic()) + self.host.run_lease
        log.warning(
            "thread %r: the run lock's connection failed during %s (%s); taking the lock again on a new connection "
            "(its lease keeps the thread meanwhile)",
            thread_id,
            what,
            cause or "it was closed",
        )
        delays = pg_connect.RETRY_BACKOFF.delays()
        while True:
            attempt = AsyncExitStack()
            sent = time.monotonic()
            try:
                conn = await attempt.enter_async_context(pool.connection(timeout=self.host.connect_timeout))
                row = await (await conn.execute(self.q["reclaim_lease"], params)).fetchone()
            except (psycopg.OperationalError, PoolTimeout) as exc:
                await attempt.__aexit__(type(exc), exc, exc.__traceback__)
                if not pg_connect.is_transient(exc) or time.monotonic() > deadline:
                    lease.lost = f"its PostgreSQL connection failed during {what} and was not back within its lease"
                    raise RunLockLostError(thread_id, f"{lease.lost}: {type(exc).__name__}: {exc}") from exc
                if pg_connect.is_connection_lost(exc):
                    await pool.check()
                await asyncio.sleep(next(delays))
                continue
            assert row is not None
            if row[0] and row[1]:
                lease.confirm(sent, self.host.run_lease)
                self.stacks[thread_id].push_async_exit(attempt)
                self.conns[thread_id] = conn
                log.warning("thread %r: run lock taken again on a new connection; the run goes on", thread_id)
                return conn
            if row[0]:
                await conn.execute(self.q["unlock"], (lease.key,))
            await attempt.aclose()
            holder = Holder.from_row(row[2:])
            if holder is not None and holder.owner == lease.owner and time.monotonic() <= deadline:
                await asyncio.sleep(next(delays))  # another run holds the advisory lock while it finds the lease ours
                continue
            taker = "its lease was released" if holder is None else f"{holder.where(self._process())} took its lease"
            lease.lost = f"its PostgreSQL connection failed during {what}, and meanwhile {taker}"
            raise RunLockLostError(thread_id, lease.lost)

    def holds(self, thread_id: str) -> bool:
        """Whether a run of this checkpointer holds *thread_id*'s lease right now (taken, not yet released: a
        dropped lock connection does not change it, a lost lease does)."""
        lease = self.leases.get(thread_id)
        return lease is not None and lease.lost is None and self.unlock_with_write.get(thread_id) != "released"

    def release_with_next_write(self, thread_id: str) -> None:
        """The unlock is pipelined behind the run's last state write (it runs after the write commits): a run
        costs one round trip less. Only on the lock's own connection, and only while this process holds it."""
        if thread_id in self.conns:
            self.unlock_with_write[thread_id] = "pending"

    async def check(self, thread_id: str) -> None:
        """No round trip while the lease is surely held (renewed in time) and its connection is up: a run's state
        reads and writes and its ledger reads go through the lock's own connection (:meth:`run`). Else one:
        the lease renewed on that connection, or the lock taken again on a new one (:meth:`_reclaim`). Raises
        :class:`RunLockLostError` once the lease is known to be another run's."""
        lease = self.leases.get(thread_id)
        if lease is None:
            return
        if lease.lost is not None:
            raise RunLockLostError(thread_id, lease.lost)
        conn = self.conns.get(thread_id)
        if conn is None or not (conn.broken or conn.closed or time.monotonic() >= lease.confirmed_until):
            return
        async with self.guards[thread_id]:
            conn = self.conns.get(thread_id)
            if conn is None:
                return
            if not (conn.broken or conn.closed):
                sent = time.monotonic()
                try:
                    cur = await conn.execute(self.q["renew_leases"], (self.host.run_lease, [thread_id], [lease.owner]))
                    renewed = await cur.fetchone() is not None
                except psycopg.OperationalError as exc:
                    if not (conn.broken or conn.closed):
                        raise
                    await self._reclaim(thread_id, "its fencing check", exc)
                    return
                if not renewed:
                    lease.lost = "its lease ran out and another run took it (renewals did not reach PostgreSQL)"
                    raise RunLockLostError(thread_id, lease.lost)
                lease.confirm(sent, self.host.run_lease)
                return
            await self._reclaim(thread_id, "its fencing check", None)
