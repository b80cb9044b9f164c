"""What a transactional tool's body gets as its transaction, wherever the framework runs the body: the ledger's
connection, or a view of it that runs each statement on the connection's own event loop.

- SQLite (``sqlite3.Connection``, no loop): the connection itself (its ``BEGIN IMMEDIATE`` holds while the body
  runs; the thread that opened the transaction waits for the body).
- PostgreSQL (``psycopg.AsyncConnection``, bound to the loop that opened it): the connection in a coroutine on that
  loop; a :class:`LoopTransaction` (awaitable ``execute``) in a coroutine on another loop; a
  :class:`BlockingTransaction` (``execute`` waited for) in a plain function's thread.

The integrations' ``current_transaction()`` answer with :func:`transaction_view`."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from tenxgraph.core.tools.context import Transaction
from tenxgraph.utils.errors import TransactionEndedError

__all__ = [
    "BlockingCursor",
    "BlockingTransaction",
    "LoopCursor",
    "LoopTransaction",
    "statements_done",
    "transaction_view",
]
T = TypeVar("T")


def transaction_view(found: Transaction) -> Any:
    """*found*'s connection as the code running here can use it (see the module's docstring)."""
    if found.loop is None:
        return found.connection
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return BlockingTransaction(found.connection, found.loop, found)
    if running is found.loop:
        return found.connection
    return LoopTransaction(found.connection, found.loop, found)


async def statements_done(found: Transaction) -> None:
    """Once the body's scope is left (*found* ended): wait for the statements its views still run, so that the
    transaction commits or rolls back after them (a body cancelled while its thread was in a statement)."""
    while True:
        with found.guard:
            if not found.running[0]:
                return
        await asyncio.sleep(0.001)


async def _while_open(coroutine: Coroutine[Any, Any, T], found: Transaction | None) -> T:
    """*coroutine*, run on the connection's loop only if *found* has not ended, counted as running meanwhile."""
    if found is None:
        return await coroutine
    with found.guard:
        if found.ended.is_set():
            coroutine.close()
            raise TransactionEndedError()
        found.running[0] += 1
    try:
        return await coroutine
    finally:
        with found.guard:
            found.running[0] -= 1


class _View:
    """What the two views share: the ``psycopg.AsyncConnection`` (*connection*) on its *loop*, and the
    :class:`~tenxgraph.core.tools.context.Transaction` they view (*transaction*: a statement after its end raises
    :class:`~tenxgraph.utils.errors.TransactionEndedError` and is not run)."""

    def __init__(
        self, connection: Any, loop: asyncio.AbstractEventLoop, transaction: Transaction | None = None
    ) -> None:
        self.connection, self._loop, self._transaction = connection, loop, transaction

    @property
    def info(self) -> Any:
        """The connection's ``info`` (its DSN, server version, ...)."""
        return self.connection.info

    def _submit(self, coroutine: Coroutine[Any, Any, T]) -> Any:
        """*coroutine* started on the connection's loop, if the transaction is open then: its future."""
        return asyncio.run_coroutine_threadsafe(_while_open(coroutine, self._transaction), self._loop)


class _Cursor:
    """A cursor of a view: *cursor*'s ``rowcount``, its fetches run through *transaction* (the view)."""

    def __init__(self, transaction: Any, cursor: Any) -> None:
        self._transaction, self._cursor = transaction, cursor

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)


class BlockingCursor(_Cursor):
    """A cursor of a :class:`BlockingTransaction`: what it fetches, fetched on the connection's loop."""

    def fetchone(self) -> Any:
        return self._transaction.run(self._cursor.fetchone())

    def fetchall(self) -> list[Any]:
        rows: list[Any] = self._transaction.run(self._cursor.fetchall())
        return rows


class BlockingTransaction(_View):
    """A plain function's view of a PostgreSQL transaction that runs on another thread's event loop: each
    statement is run there, and waited for here (see :class:`_View` for its arguments)."""

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run *coroutine* (one using :attr:`connection`) on the transaction's loop; its result."""
        result: T = self._submit(coroutine).result()
        return result

    def execute(self, query: Any, params: Any = None) -> BlockingCursor:
        """``connection.execute(query, params)``, waited for."""
        return BlockingCursor(self, self.run(self.connection.execute(query, params)))


class LoopCursor(_Cursor):
    """A cursor of a :class:`LoopTransaction`: ``await cursor.fetchone()``, as psycopg's ``AsyncCursor``."""

    async def fetchone(self) -> Any:
        return await self._transaction.run(self._cursor.fetchone())

    async def fetchall(self) -> list[Any]:
        rows: list[Any] = await self._transaction.run(self._cursor.fetchall())
        return rows


class LoopTransaction(_View):
    """A coroutine's view of a PostgreSQL transaction whose connection belongs to another event loop (a framework
    that runs the tool on a loop of its own): ``await tx.execute(query, params)`` as on psycopg's
    ``AsyncConnection``, each statement run on the connection's loop (see :class:`_View` for its arguments)."""

    async def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run *coroutine* (one using :attr:`connection`) on the connection's loop; its result."""
        result: T = await asyncio.wrap_future(self._submit(coroutine))
        return result

    async def execute(self, query: Any, params: Any = None) -> LoopCursor:
        """``await connection.execute(query, params)``, on the connection's loop."""
        return LoopCursor(self, await self.run(self.connection.execute(query, params)))
