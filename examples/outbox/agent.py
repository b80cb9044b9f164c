"""An agent that emails through an outbox. ``queue_email`` is a transactional tool: its outbox row and its ledger
record commit in one transaction of the checkpointer's database, so a crash anywhere, while it runs or between
its return and its record included, leaves both or neither, and the resumed call queues the email exactly once.
A relay, in a process of its own, sends what is queued to the email provider with the row's delivery key, which
the provider honours.

SQLite gives the tool its ``sqlite3.Connection`` (a plain function, in a worker thread); PostgreSQL a
``psycopg.AsyncConnection`` (an ``async def``), with the outbox in the checkpointer's schema."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from examples.payments import LocalProvider, Provider
from tenxgraph import CompiledGraph, ReactAgent, Reply, ScriptedModel, ToolContext, tool
from tenxgraph.storage.checkpointer import BaseCheckpointer, SqliteCheckpointer

COLUMNS = """(
    delivery_key TEXT PRIMARY KEY,
    thread_id TEXT NOT NULL,
    recipient TEXT NOT NULL,
    subject TEXT NOT NULL,
    sent INTEGER NOT NULL DEFAULT 0
)"""

#: Called inside the transaction once the row is written (the crash matrix counts the effect there).
OnQueued = Callable[[Any, dict[str, Any]], object]


def outbox_table(checkpointer: BaseCheckpointer) -> str:
    """Where the outbox lives: the checkpointer's own database (and, on PostgreSQL, its schema)."""
    schema = getattr(checkpointer, "schema", None)
    return f"{schema}.outbox" if checkpointer.transactions == "async" and schema else "outbox"


def make_queue_email(checkpointer: BaseCheckpointer, on_queued: OnQueued | None = None) -> Any:
    table = outbox_table(checkpointer)
    insert = "INSERT INTO {t} (delivery_key, thread_id, recipient, subject) VALUES ({v})"

    def row_of(to: str, subject: str, ctx: ToolContext) -> dict[str, Any]:
        return {"delivery_key": ctx.idempotency_key, "thread_id": ctx.thread_id, "recipient": to, "subject": subject}

    if checkpointer.transactions == "async":

        @tool(effect="transactional", name="queue_email")
        async def queue_email_pg(to: str, subject: str, tx: Any, ctx: ToolContext) -> str:
            """Queue an email; the relay sends it.

            Args:
                to: The recipient.
                subject: The subject line.
            """
            row = row_of(to, subject, ctx)
            await tx.execute(f"CREATE TABLE IF NOT EXISTS {table} {COLUMNS}")
            values = ", ".join(f"%({k})s" for k in row)
            await tx.execute(insert.format(t=table, v=values), row)
            if on_queued is not None:
                await on_queued(tx, row)  # type: ignore[misc]  # (async here: PostgreSQL)
            return f"Queued '{subject}' for {to}."

        return queue_email_pg

    @tool(effect="transactional")
    def queue_email(to: str, subject: str, tx: sqlite3.Connection, ctx: ToolContext) -> str:
        """Queue an email; the relay sends it.

        Args:
            to: The recipient.
            subject: The subject line.
        """
        # tx is the checkpointer's own connection, inside the transaction that also writes this call's ledger
        # record: the row below commits with it, or not at all.
        row = row_of(to, subject, ctx)
        tx.execute(f"CREATE TABLE IF NOT EXISTS {table} {COLUMNS}")
        tx.execute(insert.format(t=table, v=", ".join(f":{k}" for k in row)), row)
        if on_queued is not None:
            on_queued(tx, row)
        return f"Queued '{subject}' for {to}."

    return queue_email


def build_outbox_agent(
    checkpointer: BaseCheckpointer | None = None, on_queued: OnQueued | None = None
) -> CompiledGraph[Any]:
    checkpointer = checkpointer or SqliteCheckpointer("outbox.db")
    model = ScriptedModel(
        [
            Reply(tool_calls=[("queue_email", {"to": "ada@example.com", "subject": "Your refund"})]),
            "I emailed you about your refund.",
        ]
    )
    return ReactAgent(model, tools=[make_queue_email(checkpointer, on_queued)]).compile(checkpointer)


def relay(database: str, provider: Provider, table: str = "outbox") -> int:
    """Send every queued email once: the provider honours the row's delivery key, so a relay that dies after
    sending and before marking the row sent sends nothing twice when it runs again. *database*: a SQLite file, or
    a PostgreSQL DSN, as a URL or as ``key=value`` words (then *table* is ``schema.outbox``). Returns how many it
    sent."""
    conn: Any
    if database.startswith(("postgresql://", "postgres://")) or "=" in database:  # (a conninfo: "host=... port=...")
        import psycopg

        conn, mark = psycopg.connect(database, autocommit=True), "%s"
        exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0]
    else:
        conn, mark = sqlite3.connect(database, timeout=30, isolation_level=None), "?"
        exists = conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    try:
        if not exists:
            return 0
        rows = conn.execute(
            f"SELECT delivery_key, thread_id, recipient, subject FROM {table} WHERE sent = 0"
        ).fetchall()
        for key, thread, recipient, subject in rows:
            provider.apply("email", {"thread": thread, "to": recipient, "subject": subject}, idempotency_key=key)
            conn.execute(f"UPDATE {table} SET sent = 1 WHERE delivery_key = {mark}", (key,))
        return len(rows)
    finally:
        conn.close()


__all__ = ["LocalProvider", "build_outbox_agent", "make_queue_email", "outbox_table", "relay"]
