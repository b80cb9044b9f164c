"""A ticket desk as an MCP server, built with the official ``mcp`` SDK: its effects are rows in a SQLite file of its
own (outside the agent's process), and its tools say what a re-run means in their annotations.

    python -m examples.mcp_tools.ticket_server --db tickets.db                       # stdio
    python -m examples.mcp_tools.ticket_server --db tickets.db --http --port 8765    # streamable HTTP
"""

from __future__ import annotations

import argparse
import os
import sqlite3
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

#: Where a client's idempotency key travels in a request's ``_meta`` (what tenxgraph sends).
KEY_META = "tenxgraph/idempotency-key"

READ = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
ADDS = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
KEYED = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=True)

server = MCPServer("tickets", instructions="A ticket desk: open tickets, add notes, refund orders.")
DB = os.environ.get("TICKETS_DB", "tickets.db")


TABLES = (
    "tickets (id INTEGER PRIMARY KEY, title TEXT, meta_key TEXT)",
    "notes (id INTEGER PRIMARY KEY, ticket INTEGER, note TEXT, key TEXT UNIQUE)",
    "refunds (id INTEGER PRIMARY KEY, order_id TEXT, amount REAL, key TEXT UNIQUE)",
)


def init_db() -> None:
    """The database made once, before the server serves: WAL (a setting the file keeps) and the tables. (Made
    by each call's connection instead, two first calls at once could both try to switch a new file to WAL, and
    one failed with "database is locked": the busy timeout does not cover that switch.)"""
    conn = sqlite3.connect(DB, timeout=30, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        for table in TABLES:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {table}")
    finally:
        conn.close()


def db() -> sqlite3.Connection:
    return sqlite3.connect(DB, timeout=30, isolation_level=None)


def meta_key(ctx: Context[Any, Any]) -> str | None:
    meta = ctx.request_context.meta
    value = meta.get(KEY_META) if isinstance(meta, dict) else getattr(meta, KEY_META, None) if meta else None
    return str(value) if value is not None else None


@server.tool(annotations=ADDS)
def open_ticket(title: str, ctx: Context[Any, Any]) -> str:
    """Open a support ticket (each call opens one more)."""
    with db() as conn:
        row = conn.execute("INSERT INTO tickets (title, meta_key) VALUES (?, ?)", (title, meta_key(ctx)))
    return f"opened ticket #{row.lastrowid}: {title}"


@server.tool(annotations=KEYED)
def add_note(ticket: int, note: str, ctx: Context[Any, Any]) -> str:
    """Add a note to a ticket (a repeated request with the same idempotency key adds nothing)."""
    with db() as conn:
        done = conn.execute(
            "INSERT OR IGNORE INTO notes (ticket, note, key) VALUES (?, ?, ?)", (ticket, note, meta_key(ctx))
        ).rowcount
    return f"note {'added to' if done else 'was already on'} ticket #{ticket}"


@server.tool(annotations=KEYED)
def refund(order_id: str, amount: float, idempotency_key: str) -> dict[str, Any]:
    """Refund an order (the provider applies a key once)."""
    with db() as conn:
        insert = "INSERT OR IGNORE INTO refunds (order_id, amount, key) VALUES (?, ?, ?)"
        conn.execute(insert, (order_id, amount, idempotency_key))
        row = conn.execute("SELECT id FROM refunds WHERE key = ?", (idempotency_key,)).fetchone()
    return {"refund_id": f"R-{row[0]}", "order_id": order_id, "amount": amount}


@server.tool(annotations=READ)
def get_ticket(ticket: int) -> dict[str, Any]:
    """Look a ticket up, with its notes."""
    with db() as conn:
        row = conn.execute("SELECT id, title FROM tickets WHERE id = ?", (ticket,)).fetchone()
        if row is None:
            raise ToolError(f"no ticket #{ticket}")
        notes = [n for (n,) in conn.execute("SELECT note FROM notes WHERE ticket = ? ORDER BY id", (ticket,))]
    return {"ticket": row[0], "title": row[1], "notes": notes}


@server.tool(annotations=ADDS)
def exit_server(code: int = 3) -> str:
    """Stop the server process at once (for tests of a server that dies mid-run)."""
    os._exit(code)


def main() -> None:
    global DB
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default=DB)
    parser.add_argument("--http", action="store_true")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    DB = args.db
    init_db()
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.port)
    else:
        server.run()


if __name__ == "__main__":
    main()
