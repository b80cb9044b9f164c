"""The table a transactional tool's tests write, in the ledger's own database (SQLite file, or the PostgreSQL
checkpointer's schema), counted from outside the run: shared by the LangGraph and Pydantic AI tests."""

from __future__ import annotations

import sqlite3
from typing import Any


class BookingTable:
    """``bookings (order_id)`` in *ledger*'s database, made before the run (two parallel ``CREATE TABLE IF NOT
    EXISTS`` race on PostgreSQL's catalog). ``runs`` and ``seen`` (the transaction's type each body got) are the
    bodies' to count."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self.pg = ledger.transactions == "async"
        self.table = f"{ledger.schema}.bookings" if self.pg else "bookings"
        self.mark = "%s" if self.pg else "?"
        self.runs = 0
        self.seen: list[str] = []
        create = f"CREATE TABLE IF NOT EXISTS {self.table} (order_id TEXT NOT NULL)"
        if self.pg:
            import psycopg

            with psycopg.connect(ledger.postgres_dsn, autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {ledger.schema}")
                conn.execute(create)
        else:
            with sqlite3.connect(ledger.path) as conn:
                conn.execute(create)

    def count(self) -> dict[str, int]:
        """The rows committed, by order id."""
        query = f"SELECT order_id, count(*) FROM {self.table} GROUP BY order_id"
        if self.pg:
            import psycopg

            with psycopg.connect(self.ledger.postgres_dsn, autocommit=True) as conn:
                rows = conn.execute(query).fetchall()
        else:
            with sqlite3.connect(self.ledger.path) as conn:
                rows = conn.execute(query).fetchall()
        return {str(order): int(n) for order, n in rows}
