"""`pytest --crash-matrix examples/outbox`: the email is queued, and sent, exactly once at every crash point."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from examples.outbox.agent import build_outbox_agent
from pytest_replaysafe.effects import Effects
from pytest_replaysafe.harness import CrashRun
from tenxgraph import Message

REQUEST = {"messages": [Message.text_message("email me about my refund")]}
ROOT = Path(__file__).resolve().parents[2]


# SQLite: the checkpointer whose transaction a tool can join (see docs/replay-safe-tools.md).
@pytest.mark.crash_matrix(backends=["sqlite"])
def test_the_email_is_queued_and_sent_exactly_once(crash_run: CrashRun, effects: Effects) -> None:
    app = build_outbox_agent(crash_run.checkpointer, lambda tx, row: effects.apply_in(tx, "queued", row))
    result = crash_run.invoke(app, REQUEST)
    assert result.final_text == "I emailed you about your refund."
    database = str(crash_run.checkpointer.path)
    with sqlite3.connect(database) as conn:
        rows = conn.execute("SELECT count(*) FROM outbox WHERE thread_id = ?", (crash_run.thread_id,)).fetchone()
    assert rows == (1,)  # queued once, whatever the crash: the row commits with the ledger record
    relay = [sys.executable, "-m", "examples.outbox", "relay", database, str(effects.path)]
    subprocess.run(relay, cwd=ROOT, check=True, capture_output=True, timeout=60)  # a process of its own
    sent = [e for e in effects.applied("email") if e["payload"]["thread"] == crash_run.thread_id]
    assert len(sent) == 1
