"""A LangGraph tool's writes in its ledger record's transaction (``effect="transactional"``).

LangGraph calls a tool with the arguments the model gave (it strips injected ones), so a transactional LangGraph
tool reads its transaction with :func:`current_transaction` instead of taking a ``tx`` parameter. What it gets:

- SQLite (``SqliteCheckpointer``): the ledger's ``sqlite3.Connection``, inside ``BEGIN IMMEDIATE``. The tool is a
  plain function and the graph runs with ``invoke`` / ``stream``: its body runs in the worker thread that holds
  the transaction.
- PostgreSQL (``PgCheckpointer``): an ``async def`` tool (``ainvoke``) gets the ``psycopg.AsyncConnection`` of
  the transaction; a plain function (``invoke``, run by LangGraph in a worker thread) gets a
  :class:`BlockingTransaction` over it: ``execute(query, params)`` returns a cursor whose ``fetchone``,
  ``fetchall`` and ``rowcount`` answer at once, and ``run(coroutine)`` runs any coroutine of yours with
  ``.connection``.

Its writes and the call's ledger record commit together, or neither does: a crash anywhere before the commit
leaves nothing, and the resumed call writes once."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from tenxgraph.ledger import current_transaction as _current

__all__ = ["BlockingCursor", "BlockingTransaction", "current_transaction"]
T = TypeVar("T")


def current_transaction() -> Any:
    """In a transactional LangGraph tool's body: the transaction its writes go through (see the module's
    docstring). A ``RuntimeError`` elsewhere."""
    found = _current()
    if found is None:
        raise RuntimeError(
            "current_transaction(): no transaction here. It is open only in the body of a tool declared "
            "effect='transactional' (its metadata, or ReplaySafeToolNode(effects={name: 'transactional'})), "
            "called through ReplaySafeToolNode or ReplaySafeToolCalls with a SqliteCheckpointer or PgCheckpointer "
            "ledger"
        )
    if found.loop is None:
        return found.connection
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    return found.connection if running is found.loop else BlockingTransaction(found.connection, found.loop)


class BlockingCursor:
    """A cursor of a :class:`BlockingTransaction`: what it fetches, fetched on the connection's loop."""

    def __init__(self, transaction: BlockingTransaction, cursor: Any) -> None:
        self._transaction, self._cursor = transaction, cursor

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    def fetchone(self) -> Any:
        return self._transaction.run(self._cursor.fetchone())

    def fetchall(self) -> list[Any]:
        rows: list[Any] = self._transaction.run(self._cursor.fetchall())
        return rows


class BlockingTransaction:
    """A plain function's view of a PostgreSQL transaction that runs on another thread's event loop: each
    statement is run there, and waited for here. *connection*: the ``psycopg.AsyncConnection``."""

    def __init__(self, connection: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.connection, self._loop = connection, loop

    @property
    def info(self) -> Any:
        """The connection's ``info`` (its DSN, server version, ...)."""
        return self.connection.info

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run *coroutine* (one using :attr:`connection`) on the transaction's loop; its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def execute(self, query: Any, params: Any = None) -> BlockingCursor:
        """``connection.execute(query, params)``, waited for."""
        return BlockingCursor(self, self.run(self.connection.execute(query, params)))
