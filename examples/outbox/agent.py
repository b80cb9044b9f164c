"""An agent that emails through an outbox. ``queue_email`` is a transactional tool: its outbox row and its ledger
record commit in one SQLite transaction, so a crash anywhere, while it runs or between its return and its record
included, leaves both or neither, and the resumed call queues the email exactly once. A relay, in a process of
its own, sends what is queued to the email provider with the row's delivery key, which the provider honours."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from examples.payments import LocalProvider, Provider
from tenxgraph import CompiledGraph, ReactAgent, Reply, ScriptedModel, ToolContext, tool
from tenxgraph.storage.checkpointer import BaseCheckpointer, SqliteCheckpointer

OUTBOX = """CREATE TABLE IF NOT EXISTS outbox (
    delivery_key TEXT PRIMARY KEY,
    thread_id TEXT NOT NULL,
    recipient TEXT NOT NULL,
    subject TEXT NOT NULL,
    sent INTEGER NOT NULL DEFAULT 0
)"""

#: Called inside the transaction once the row is written (the crash matrix counts the effect there).
OnQueued = Callable[[sqlite3.Connection, dict[str, Any]], object]


def make_queue_email(on_queued: OnQueued | None = None) -> Any:
    @tool(effect="transactional")
    def queue_email(to: str, subject: str, tx: sqlite3.Connection, ctx: ToolContext) -> str:
        """Queue an email; the relay sends it.

        Args:
            to: The recipient.
            subject: The subject line.
        """
        # tx is the checkpointer's own connection, inside the transaction that also writes this call's ledger
        # record: the row below commits with it, or not at all.
        tx.execute(OUTBOX)
        row = {"delivery_key": ctx.idempotency_key, "thread_id": ctx.thread_id, "recipient": to, "subject": subject}
        tx.execute(
            "INSERT INTO outbox (delivery_key, thread_id, recipient, subject) "
            "VALUES (:delivery_key, :thread_id, :recipient, :subject)",
            row,
        )
        if on_queued is not None:
            on_queued(tx, row)
        return f"Queued '{subject}' for {to}."

    return queue_email


def build_outbox_agent(
    checkpointer: BaseCheckpointer | None = None, on_queued: OnQueued | None = None
) -> CompiledGraph[Any]:
    model = ScriptedModel(
        [
            Reply(tool_calls=[("queue_email", {"to": "ada@example.com", "subject": "Your refund"})]),
            "I emailed you about your refund.",
        ]
    )
    return ReactAgent(model, tools=[make_queue_email(on_queued)]).compile(
        checkpointer or SqliteCheckpointer("outbox.db")
    )


def relay(database: str, provider: Provider) -> int:
    """Send every queued email once: the provider honours the row's delivery key, so a relay that dies after
    sending and before marking the row sent sends nothing twice when it runs again. Returns how many it sent."""
    conn = sqlite3.connect(database, timeout=30)
    try:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'outbox'").fetchone():
            return 0
        rows = conn.execute("SELECT delivery_key, thread_id, recipient, subject FROM outbox WHERE sent = 0").fetchall()
        for key, thread, recipient, subject in rows:
            provider.apply("email", {"thread": thread, "to": recipient, "subject": subject}, idempotency_key=key)
            with conn:
                conn.execute("UPDATE outbox SET sent = 1 WHERE delivery_key = ?", (key,))
        return len(rows)
    finally:
        conn.close()


__all__ = ["LocalProvider", "build_outbox_agent", "make_queue_email", "relay"]
