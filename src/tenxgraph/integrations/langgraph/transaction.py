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

from typing import Any

from tenxgraph.ledger import BlockingCursor, BlockingTransaction, transaction_view
from tenxgraph.ledger import current_transaction as _current

__all__ = ["BlockingCursor", "BlockingTransaction", "current_transaction"]


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
    return transaction_view(found)
