"""PgCheckpointer's connections: the pool's lifecycle across forks and event loops, the schema's setup and
migration on first use, and a statement retried on transient failures (the rules are in :mod:`.pg_connect`)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

import tenxgraph.storage.checkpointer.pg_connect as pg_connect
from tenxgraph.storage.checkpointer.base import migration_plan
from tenxgraph.storage.checkpointer.pg_settings import PgSettings
from tenxgraph.storage.checkpointer.pg_sql import MIGRATIONS
from tenxgraph.utils.constants import LOGGER_NAME
from tenxgraph.utils.errors import ConfigError, StorageConnectionError

log = logging.getLogger(LOGGER_NAME)
T = TypeVar("T")


class PgPool:
    """The connection pool of one checkpointer: opened on first use in the event loop that uses it, opened anew
    in a forked child (which never uses its parent's sockets), or the caller's own pool (``pool=``)."""

    def __init__(self, dsn: str | None, pool: AsyncConnectionPool | None, schema: str, settings: PgSettings) -> None:
        self.dsn, self.schema, self.settings = dsn, schema, settings
        self._user_pool = pool
        self.pool: AsyncConnectionPool | None = pool
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = os.getpid()
        self._ready = False
        #: The schema is known to be set up (survives a fork: a forked child neither probes nor sets up again).
        self.set_up = False
        self._open_lock: asyncio.Lock | None = None

    def forked(self) -> bool:
        """This process is a fork of the one that opened the pool; the pool is forgotten (not closed: its sockets
        are the parent's), and the next :meth:`open` opens a new one."""
        if self._pid == os.getpid():
            return False
        self._pid, self._loop, self._ready, self._open_lock = os.getpid(), None, False, None
        self.pool = self._user_pool if self.dsn is None else None
        return True

    async def open(self) -> AsyncConnectionPool:
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop and self.dsn is not None:
            raise ConfigError(
                "this PgCheckpointer's connection pool belongs to another event loop; use either its async methods "
                "from one loop or its sync methods (invoke, get_thread ...), not both"
            )
        if self._ready and self.pool is not None:
            return self.pool
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        timeout = self.settings.connect_timeout
        async with self._open_lock:
            if self.pool is None:
                assert self.dsn is not None
                if not self.set_up:  # fail fast, with why (a forked child's parent has connected already)
                    await pg_connect.probe(self.dsn, timeout, self.settings.retries)
                self.pool = AsyncConnectionPool(
                    self.dsn,
                    min_size=1,
                    max_size=self.settings.max_pool_size,
                    max_idle=self.settings.pool_max_idle,
                    open=False,
                    kwargs={"autocommit": True},
                    timeout=timeout,
                    name=f"tenxgraph-{self.schema}",
                )
                await self.pool.open(wait=True, timeout=timeout)
            self._loop = loop
            if self.settings.auto_setup and not self.set_up:
                await self.setup(self.pool)
            self._ready = self.set_up = True
        return self.pool

    async def close(self) -> None:
        if self._pid != os.getpid():
            return
        if self.pool is not None and self._user_pool is None:
            await self.pool.close()
            self.pool = None
        self._ready, self._loop, self._open_lock = False, None, None

    async def retrying(
        self, pool: AsyncConnectionPool, what: str, op: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]
    ) -> T:
        """Run *op* on a connection of the open *pool*; retry transient failures only (see :mod:`.pg_connect`)."""
        delays = pg_connect.RETRY_BACKOFF.delays()
        for attempt in range(self.settings.retries + 1):
            try:
                async with pool.connection(timeout=self.settings.connect_timeout) as conn:
                    return await op(conn)
            except (psycopg.OperationalError, PoolTimeout) as exc:
                if not pg_connect.is_transient(exc):
                    raise
                await self.before_retry(pool, what, exc, attempt, next(delays))
        raise AssertionError("unreachable")

    async def before_retry(
        self, pool: AsyncConnectionPool, what: str, exc: Exception, attempt: int, delay: float
    ) -> None:
        """After a transient failure: give up after the last attempt; else, when the connection was lost (the
        server dropped it: a restart, a failover, an idle-session killer), have the pool test its idle connections
        and replace the dead ones (they went with it, and the next attempt would take one), wait, and go on."""
        retries, timeout = self.settings.retries, self.settings.connect_timeout
        if attempt == retries:
            raise StorageConnectionError(
                f"PostgreSQL {what} failed {retries + 1} times (connect_timeout="
                f"{timeout:g}s, retries={retries}): {type(exc).__name__}: {exc}"
            ) from exc
        log.warning(
            "PostgreSQL %s failed (%s: %s); retrying in %.2fs (attempt %d of %d)",
            what,
            type(exc).__name__,
            exc,
            delay,
            attempt + 1,
            retries,
        )
        if pg_connect.is_connection_lost(exc):
            await pool.check()
        await asyncio.sleep(delay)

    async def setup(self, pool: AsyncConnectionPool) -> None:
        """Create or migrate the schema, under an advisory lock (safe from several processes at once)."""
        schema = sql.Identifier(self.schema)
        lock_key = f"tenxgraph-schema:{self.schema}"
        async with pool.connection(timeout=self.settings.connect_timeout) as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock_key,))
            await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
            await conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {}.schema_version "
                    "(version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
                ).format(schema)
            )
            cur = await conn.execute(sql.SQL("SELECT coalesce(max(version), 0) FROM {}.schema_version").format(schema))
            row = await cur.fetchone()
            current = int(row[0]) if row else 0
            for version, statements in migration_plan(current, MIGRATIONS, f"schema {self.schema!r}"):
                for statement in statements:
                    await conn.execute(sql.SQL(statement).format(schema=schema))
                await conn.execute(
                    sql.SQL("INSERT INTO {}.schema_version (version) VALUES (%s)").format(schema), (version,)
                )
