"""`pytest --crash-matrix examples/outbox`: the email is queued, and sent, exactly once at every crash point."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from examples.outbox.agent import build_outbox_agent, outbox_table, relay
from pytest_replaysafe import CrashRun, Effects
from tenxgraph import Message

REQUEST = {"messages": [Message.text_message("email me about my refund")]}
ROOT = Path(__file__).resolve().parents[2]


def queued(checkpointer: Any, thread: str) -> int:
    table = outbox_table(checkpointer)
    if checkpointer.transactions == "async":
        import psycopg

        with psycopg.connect(checkpointer.postgres_dsn) as conn:
            found = conn.execute(f"SELECT count(*) FROM {table} WHERE thread_id = %s", (thread,)).fetchone()
    else:
        with sqlite3.connect(checkpointer.path) as conn:
            found = conn.execute(f"SELECT count(*) FROM {table} WHERE thread_id = ?", (thread,)).fetchone()
    return int(found[0]) if found else 0


# The checkpointers whose transaction a tool can join (docs/replay-safe-tools.md): SQLite and PostgreSQL.
@pytest.mark.crash_matrix(backends=["sqlite", "postgres", "postgres+redis"])
def test_the_email_is_queued_and_sent_exactly_once(
    crash_run: CrashRun, effects: Effects, request: pytest.FixtureRequest
) -> None:
    cp = crash_run.checkpointer
    if cp.transactions == "async":  # PostgreSQL: the effect is a row of the checkpointer's schema
        app = build_outbox_agent(cp, lambda tx, row: effects.aapply_in(tx, "queued", row, cp.schema))
    else:
        app = build_outbox_agent(cp, lambda tx, row: effects.apply_in(tx, "queued", row))
    result = crash_run.invoke(app, REQUEST)
    assert result.final_text == "I emailed you about your refund."
    assert queued(cp, crash_run.thread_id) == 1  # whatever the crash: the row commits with the ledger record
    # (the database itself, not the checkpointer's DSN: in the matrix's outage cells that goes through the harness's
    # fault proxy, and the relay is no part of the run)
    database = request.getfixturevalue("pg_dsn") if cp.transactions == "async" else str(cp.path)
    # The relay reads only the database: it shares nothing with the run (test_the_relay_runs_as_a_process_of_its_own
    # runs it as `python -m examples.outbox relay`, which costs an interpreter start per call).
    relay(database, effects, outbox_table(cp))
    sent = [e for e in effects.applied("email") if e["payload"]["thread"] == crash_run.thread_id]
    assert len(sent) == 1


def test_the_relay_runs_as_a_process_of_its_own(tmp_path: Path) -> None:
    """`python -m examples.outbox relay DATABASE EFFECTS`: the queued email is sent once, and not again."""
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    database = tmp_path / "outbox.db"
    effects = Effects(tmp_path / "effects.db")
    cp = SqliteCheckpointer(database)
    app = build_outbox_agent(cp, lambda tx, row: effects.apply_in(tx, "queued", row))
    app.invoke(REQUEST, {"thread_id": "t1"})
    command = [sys.executable, "-m", "examples.outbox", "relay", str(database), str(effects.path), outbox_table(cp)]
    for expected in ("1", "0"):  # a second relay finds nothing left to send
        done = subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True, timeout=60)
        assert done.stdout.strip() == expected
    assert len(effects.applied("email")) == 1
