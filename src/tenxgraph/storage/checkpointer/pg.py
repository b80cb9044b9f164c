"""PgCheckpointer: PostgreSQL is the source of truth; Redis (optional) caches the latest state, guarded by version.

::

    checkpointer = PgCheckpointer(postgres_dsn="postgresql://user:password@db/tenxgraph", redis_url="redis://redis:6379/0")

Schema (created by :meth:`setup`, idempotent, under an advisory lock): ``threads`` (state JSONB, per-thread
``version``), ``messages``, ``tool_executions`` (the ledger: ``(thread_id, key)`` primary key, key TEXT never
truncated, result JSONB, ``created_at`` indexed for pruning), ``run_leases`` and ``schema_version``.

Round trips: a ledger write (or group) is one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE status = 'started'``;
a node's ledger read one ``SELECT ... key = ANY(...)``, pipelined behind the state write that added the assistant
message when the run wrote it; a state write one statement (compare-and-swap and new messages, in CTEs); the run
lock shares one pipelined round trip with the run's first reads (and a new thread's start), its release one with
the last write. A run's reads and writes of its thread use the lock's connection
(fencing); a lease keeps the thread through a dropped connection. Only transient failures are retried; a retried
state write whose first attempt may have committed is recognised as ours instead of being reported stale.

By concern: SQL in :mod:`.pg_sql`, settings :mod:`.pg_settings`, pool and retries :mod:`.pg_pool` and
:mod:`.pg_connect`, what goes with the lock :mod:`.pg_first_reads`, transactional tools :mod:`.pg_transaction`,
the cache :mod:`.pg_cache`, run locks and leases :mod:`.pg_run_lock`, :mod:`.pg_lease`. Left here: a method per
operation of the contract (past the ~350-line guide by the contract's length)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

from tenxgraph.state.messages import JSON, Message, dumps
from tenxgraph.storage.checkpointer.base import (
    BaseCheckpointer,
    MessagesAfter,
    ThreadSnapshot,
    check_thread_id,
    encode_group,
    encode_messages,
)
from tenxgraph.storage.checkpointer.retention import RESUMABLE_STATUSES, check_prune_args, prune_in_batches
from tenxgraph.utils.constants import LOGGER_NAME, install_hint
from tenxgraph.utils.errors import ConfigError, SerializationError, StaleStateError
from tenxgraph.utils.sync import run_sync

# The hyphenated spelling works with every pip; pip 23.2 (Python 3.11's) ignores "[pg_checkpoint]" with a warning.
_EXTRA_HINT = f"PgCheckpointer needs the pg-checkpoint extra: {install_hint('pg-checkpoint')}"
try:
    import psycopg
    from psycopg import sql
    from psycopg_pool import AsyncConnectionPool

    import tenxgraph.storage.checkpointer.pg_connect as pg_connect
    from tenxgraph.storage.checkpointer.pg_cache import CacheMethods, RedisStateCache
    from tenxgraph.storage.checkpointer.pg_first_reads import FirstReadsWithLock, messages_after
    from tenxgraph.storage.checkpointer.pg_pool import PgPool
    from tenxgraph.storage.checkpointer.pg_run_lock import NotHeld, PgRunLocks, advisory_key
    from tenxgraph.storage.checkpointer.pg_settings import PgSettings, PgSettingsArgs, validate_identifier
    from tenxgraph.storage.checkpointer.pg_sql import QUERIES, json_rows
    from tenxgraph.storage.checkpointer.pg_transaction import transact
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise ImportError(f"{_EXTRA_HINT} ({exc})") from exc

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = logging.getLogger(LOGGER_NAME)
T = TypeVar("T")


class PgCheckpointer(CacheMethods, BaseCheckpointer):
    def __init__(
        self,
        postgres_dsn: str | None = None,
        redis_url: str | None = None,
        *,
        pool: AsyncConnectionPool | None = None,
        redis: aioredis.Redis | None = None,
        schema: str = "public",
        **settings: Unpack[PgSettingsArgs],
    ) -> None:
        """Exactly one of *postgres_dsn* or *pool* (yours: then you open and close it); a Redis cache from
        *redis_url* or *redis* if you want one; tables in *schema*. The tuning *settings* (``cache_ttl``,
        ``max_pool_size``, ``pool_max_idle``, ``retries``, ``connect_timeout``, ``auto_setup``, ``run_lease``) are
        described in :class:`.pg_settings.PgSettings`."""
        if (postgres_dsn is None) == (pool is None):
            raise ConfigError("PgCheckpointer needs exactly one of postgres_dsn= or pool=")
        if redis_url is not None and redis is not None:
            raise ConfigError("pass redis_url= or redis=, not both")
        if postgres_dsn is not None:
            pg_connect.check_dsn(postgres_dsn)
        if redis_url is not None:
            pg_connect.check_redis_url(redis_url)
        self.settings = PgSettings.of(settings)
        self.schema = validate_identifier(schema)
        self.postgres_dsn, self.redis_url = postgres_dsn, redis_url
        given = self.settings  # (read as attributes too; run_lease: a lease's life without renewal, see pg_lease)
        self.cache_ttl, self.max_pool_size, self.retries = given.cache_ttl, given.max_pool_size, given.retries
        self.connect_timeout, self.run_lease = float(given.connect_timeout), float(given.run_lease)
        self.auto_setup: bool = given.auto_setup
        #: The host identity written in leases (None: :func:`.pg_lease.host_identity`). Processes with one identity
        #: must see each other's pids: a holder on this host whose pid is gone is taken over at once.
        self.lease_host: str | None = None
        self._pool = PgPool(postgres_dsn, pool, self.schema, self.settings)
        has_cache = redis_url is not None or redis is not None
        self._cache = RedisStateCache(self.cache_prefix, self.cache_ttl, redis_url, redis) if has_cache else None
        self._first_reads = FirstReadsWithLock()  # the run's first reads, made with its run lock, until used
        # Rendered once to plain strings (the schema is a validated identifier): psycopg caches the parsing of
        # str queries, while a sql.Composed is converted again on every call.
        self._q = {
            name: sql.SQL(text).format(schema=sql.Identifier(self.schema)).as_string() for name, text in QUERIES.items()
        }
        self._locks = PgRunLocks(self)  # the run locks this process holds (pg_run_lock.py)

    def __repr__(self) -> str:
        return f"PgCheckpointer(schema={self.schema!r}{' +redis' if self._cache is not None else ''})"

    @property
    def has_cache(self) -> bool:
        return self._cache is not None

    # -- connections (pg_pool.py) ------------------------------------------------------------------------
    async def _ensure_open(self) -> AsyncConnectionPool:
        self._forget_if_forked()
        return await self._pool.open()

    def _forget_if_forked(self) -> bool:
        """In a forked child, forget what is the parent's (its sockets, its run locks and their renewer thread,
        the reads made with its locks), never closing it; True if this process is such a child."""
        if not self._pool.forked():
            return False
        self._first_reads = FirstReadsWithLock()
        self._locks = PgRunLocks(self)
        if self._cache is not None:
            self._cache.forget_after_fork()
        return True

    async def _retrying(self, what: str, op: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T:
        """Run *op* on a pooled connection; retry transient failures only (see :mod:`.pg_connect`)."""
        return await self._pool.retrying(await self._ensure_open(), what, op)

    async def _on_thread(
        self, thread_id: str, what: str, op: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]
    ) -> T:
        """Run *op* for *thread_id* on its run lock's connection while this process holds it (a dead one is
        replaced while the lease is the run's, else :class:`RunLockLostError`), else on the pool, with retries."""
        held = await self._locks.run(thread_id, what, op)
        return held if not isinstance(held, NotHeld) else await self._retrying(what, op)

    async def asetup(self) -> None:
        """Create or migrate the schema. Idempotent; safe to call from several processes at once."""
        pool = await self._ensure_open()
        if not self.auto_setup:
            await self._pool.setup(pool)

    def setup(self) -> None:
        run_sync(self.asetup())

    # -- thread state -----------------------------------------------------------------------------------
    async def _fetch_thread(self, thread_id: str) -> ThreadSnapshot | None:
        read, found = self._first_reads.state(thread_id)
        if read:  # read in the lock's own round trip, after the lock was taken
            return found

        async def op(conn: psycopg.AsyncConnection[Any]) -> ThreadSnapshot | None:
            cur = await conn.execute(self._q["get_thread"], (thread_id,))
            row = await cur.fetchone()
            return None if row is None else ThreadSnapshot(thread_id, row[1], int(row[0]))

        return await self._on_thread(thread_id, "state read", op)

    async def aget_thread(self, thread_id: str) -> ThreadSnapshot | None:
        """The thread's state from PostgreSQL, the source of truth (the run loop resumes from this)."""
        return await self._fetch_thread(check_thread_id(thread_id))

    async def aget_cached_thread(self, thread_id: str) -> ThreadSnapshot | None:
        """The state the latest run ended with, from the Redis cache (falling back to PostgreSQL). For readers (UIs),
        never for resuming: a run in progress is not cached step by step."""
        check_thread_id(thread_id)
        cached = await self._cache.get(thread_id) if self._cache is not None else None
        return cached if cached is not None else await self._fetch_thread(thread_id)

    async def aput_thread(
        self, thread_id: str, values: dict[str, JSON], *, expected_version: int, new_messages: Sequence[Message] = ()
    ) -> int:
        check_thread_id(thread_id)
        made = self._first_reads.started(thread_id, expected_version, values, new_messages)  # (sent with the lock)
        self._first_reads.forget(thread_id)  # a read made before this write is no longer the state
        if made is not None:
            return made
        text = dumps(values, f"state of thread {thread_id!r}")
        rows = json_rows("id", "data", encode_messages(new_messages))
        params: tuple[object, ...]
        if expected_version == 0:
            query, params = self._q["create_thread"], (thread_id, text, thread_id, rows)
        else:
            query, params = self._q["update_thread"], (text, thread_id, expected_version, thread_id, rows)
        attempts = 0

        async def op(conn: psycopg.AsyncConnection[Any]) -> int:
            nonlocal attempts
            attempts += 1
            if self._locks.last_write_releases(thread_id, conn):  # one round trip: the write, then the release
                cur = await self._locks.write_and_release(conn, thread_id, query, params)
            else:
                cur = await conn.execute(query, params)
            if (row := await cur.fetchone()) is not None:
                return int(row[0])
            cur = await conn.execute(self._q["get_thread"], (thread_id,))
            stored = await cur.fetchone()
            actual = int(stored[0]) if stored else 0
            if attempts > 1 and actual == expected_version + 1 and stored is not None and stored[1] == values:
                return actual  # the attempt that lost its connection had committed: this write is ours
            raise StaleStateError(thread_id, expected_version, actual)

        version = await self._on_thread(thread_id, "state write", op)
        meta = values.get("meta")
        mid_run = isinstance(meta, dict) and meta.get("status") == "running"
        if self._cache is not None and not mid_run:  # once per run: the state a run ends with, not every step
            self._cache.put_in_background(thread_id, version, text)
        return version

    # -- messages ---------------------------------------------------------------------------------------
    async def alist_messages(self, thread_id: str) -> list[Message]:
        check_thread_id(thread_id)

        async def op(conn: psycopg.AsyncConnection[Any]) -> list[Message]:
            cur = await conn.execute(self._q["list_messages"], (thread_id,))
            return [Message.from_dict(row[0]) for row in await cur.fetchall()]

        return await self._on_thread(thread_id, "message read", op)

    async def alist_messages_after(self, thread_id: str, after_seq: int) -> MessagesAfter:
        check_thread_id(thread_id)
        pre = self._first_reads.messages(thread_id, after_seq)
        if pre is not None:  # read in the lock's own round trip, after the lock was taken
            return pre

        async def op(conn: psycopg.AsyncConnection[Any]) -> MessagesAfter:
            cur = await conn.execute(self._q["list_messages_after"], {"t": thread_id, "after": after_seq})
            return messages_after(await cur.fetchall())

        return await self._on_thread(thread_id, "message read", op)

    async def aappend_messages(self, thread_id: str, messages: Sequence[Message]) -> None:
        check_thread_id(thread_id)
        self._first_reads.forget(thread_id)
        rows = json_rows("id", "data", encode_messages(messages))

        async def op(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(self._q["append_messages"], (thread_id, rows))

        await self._retrying("message write", op)

    # -- tool ledger ------------------------------------------------------------------------------------
    async def aget_tool_results(self, thread_id: str, keys: Sequence[str]) -> dict[str, dict[str, JSON]]:
        check_thread_id(thread_id)
        if not keys:
            return {}
        if (pre := self._first_reads.ledger(thread_id, keys)) is not None:  # read behind the lock (a Resume's)
            return pre

        async def op(conn: psycopg.AsyncConnection[Any]) -> dict[str, dict[str, JSON]]:
            cur = await conn.execute(self._q["get_results"], (thread_id, list(keys)))
            return {row[0]: row[1] for row in await cur.fetchall()}

        return await self._on_thread(thread_id, "ledger read", op)  # the fence for the tools about to run

    async def _threads(self, query: str, param: object) -> list[tuple[Any, ...]]:
        async def op(conn: psycopg.AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            return await (await conn.execute(self._q[query], (param,))).fetchall()

        return await self._retrying("thread listing", op)

    async def alist_interrupted_threads(self, limit: int = 100) -> list[str]:
        return [str(row[0]) for row in await self._threads("list_running", int(limit))]

    async def acount_threads(self, status: str) -> int:
        return int((await self._threads("count_status", status))[0][0])

    # -- a tool's writes in the ledger's transaction -----------------------------------------------------
    transactions = "async"

    async def atransact(self, thread_id: str, key: str, work: Callable[[Any], Any]) -> tuple[dict[str, JSON], bool]:
        """The tool (a coroutine) gets a pooled connection inside a transaction (READ COMMITTED, its own: parallel
        transactional calls run at once and lock only the rows they write); its record is written in the same
        transaction. If another run recorded the call first, this one rolls back, writes and all, and answers with
        that record."""
        check_thread_id(thread_id)
        # Retried on a transient failure, as every pooled statement is: safe, since the attempt rolled back, or (a
        # commit whose answer was lost) committed, which the next attempt's own ledger read finds: it then does
        # not run the work.
        return await self._retrying("tool transaction", lambda conn: transact(conn, self._q, thread_id, key, work))

    async def aput_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        return await self._put_ledger("put_result", thread_id, key, dumps(record, f"ledger record {key!r}"))

    async def aput_tool_results(
        self, thread_id: str, records: Sequence[tuple[str, dict[str, JSON]]]
    ) -> list[bool | SerializationError]:
        """One statement (one commit) for the whole group; idempotent, so a retry cannot write twice."""
        check_thread_id(thread_id)
        self._first_reads.forget(thread_id)  # (a ledger read made with the lock is older than this write)
        out, texts = encode_group(records)
        if not texts:
            return out
        params = {"t": thread_id, "rows": json_rows("key", "result", [(key, text) for _, key, text in texts])}

        async def op(conn: psycopg.AsyncConnection[Any]) -> set[str]:
            cur = await conn.execute(self._q["put_results"], params)
            return {row[0] for row in await cur.fetchall()}

        written = await self._retrying("ledger write", op)
        for i, key, _ in texts:
            out[i] = key in written
        return out

    async def aput_tool_intent(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        return await self._put_ledger("put_intent", thread_id, key, dumps(record, f"ledger intent {key!r}"))

    async def _put_ledger(self, query: str, thread_id: str, key: str, text: str) -> bool:
        check_thread_id(thread_id)
        self._first_reads.forget(thread_id)

        async def op(conn: psycopg.AsyncConnection[Any]) -> bool:
            cur = await conn.execute(self._q[query], (thread_id, key, text))
            return cur.rowcount == 1

        return await self._retrying("ledger write", op)  # idempotent: a retry cannot write twice

    async def alist_tool_results(self, thread_id: str) -> dict[str, dict[str, JSON]]:
        check_thread_id(thread_id)

        async def op(conn: psycopg.AsyncConnection[Any]) -> dict[str, dict[str, JSON]]:
            cur = await conn.execute(self._q["list_results"], (thread_id,))
            return {row[0]: row[1] for row in await cur.fetchall()}

        return await self._retrying("ledger read", op)

    async def aprune_tool_executions(
        self,
        older_than: timedelta,
        *,
        include_resumable: bool = False,
        finished: Sequence[str] = (),
        batch_size: int = 1000,
    ) -> int:
        """Batched deletes along the ``created_at`` index; each batch is its own short transaction."""
        check_prune_args(older_than, batch_size, finished)
        args = (older_than, include_resumable, list(finished), list(RESUMABLE_STATUSES), batch_size)

        async def op(conn: psycopg.AsyncConnection[Any]) -> int:
            cur = await conn.execute(self._q["prune"], args)
            return cur.rowcount

        return await prune_in_batches(lambda: self._retrying("ledger prune", op), batch_size)

    async def adelete_thread(self, thread_id: str) -> None:
        check_thread_id(thread_id)
        self._first_reads.forget(thread_id)

        async def op(conn: psycopg.AsyncConnection[Any]) -> None:
            async with conn.transaction():
                for name in ("delete_results", "delete_messages", "delete_thread"):
                    await conn.execute(self._q[name], (thread_id,))

        await self._retrying("thread delete", op)
        if self._cache is not None:
            await self._cache.delete(thread_id)

    # -- lifecycle --------------------------------------------------------------------------------------
    async def aclose(self) -> None:
        if self._forget_if_forked():  # (the parent's connections are the parent's to close)
            return
        if self._cache is not None:
            await self._cache.close()
        self._locks.close()
        await self._pool.close()

    def run_lock_key(self, thread_id: str) -> int:
        """The 64-bit advisory-lock key of *thread_id* in this schema (:func:`.pg_run_lock.advisory_key`)."""
        return advisory_key(self.schema, thread_id)

    @asynccontextmanager
    async def arun_lock(self, thread_id: str) -> AsyncIterator[None]:
        """A session advisory lock on a connection held for the run, and the thread's lease, claimed in the same
        statement and round trip as the run's first reads; released with its last write. Another run is refused
        until the lease is released, runs out, or its holder is known dead (see :mod:`.pg_run_lock`)."""
        reads = self._first_reads.reader(thread_id, self._q)  # (the hints taken first: none is left for later)
        check_thread_id(thread_id)
        pool = await self._ensure_open()
        async with self._locks.hold(pool, thread_id, self.run_lock_key(thread_id), reads) as found:
            self._first_reads.keep(thread_id, found)
            try:
                yield
            finally:
                self._first_reads.forget(thread_id)

    def read_with_lock(self, thread_id: str, messages_after: int) -> None:
        """The messages are read in the lock's own round trip too (a third pipelined statement): a turn of a
        thread that exists costs one round trip less (:mod:`.pg_first_reads`)."""
        self._first_reads.plan(thread_id, messages_after)

    def write_with_lock(self, thread_id: str, values: dict[str, JSON], *, new_messages: Sequence[Message]) -> None:
        """A new thread's start goes in the lock's round trip, under this run's lease (:mod:`.pg_first_reads`)."""
        sql = dumps(values, f"state of thread {thread_id!r}"), json_rows("id", "data", encode_messages(new_messages))
        self._first_reads.plan_start(thread_id, values, new_messages, sql)

    def read_ledger_with_lock(self, thread_id: str, keys: Sequence[str]) -> None:
        self._first_reads.plan_ledger(thread_id, keys)  # (behind the lock, in its round trip: .pg_first_reads)

    def holds_thread(self, thread_id: str) -> bool:
        """Whether a run of this checkpointer holds *thread_id*'s lease right now (taken, not yet released: a
        dropped lock connection does not change it, a lost lease does)."""
        return self._locks.holds(thread_id)

    def release_lock_with_next_write(self, thread_id: str) -> None:
        """The unlock is pipelined behind the run's last state write (it runs after the write commits): a run
        costs one round trip less. Only on the lock's own connection, and only while this process holds it."""
        self._locks.release_with_next_write(thread_id)

    async def acheck_run_lock(self, thread_id: str) -> None:
        """No round trip while the lease is surely held (renewed in time) and its connection is up; else one (see
        :meth:`.pg_run_lock.PgRunLocks.check`). :class:`RunLockLostError` once the lease is another run's."""
        await self._locks.check(thread_id)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection (for tests and maintenance)."""
        pool = await self._ensure_open()
        async with pool.connection(timeout=self.connect_timeout) as conn:
            yield conn
