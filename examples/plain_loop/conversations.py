"""The loop's own conversation store: one SQLite table, each message appended in a transaction that commits
before the loop goes on (an assistant message before any of its calls runs, its calls' results together)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

_SCHEMA = """CREATE TABLE IF NOT EXISTS messages (
    thread_id TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY (thread_id, seq)
)"""


class Conversations:
    """Chat messages per thread, in the provider's format plus the loop's own ``id`` and ``is_error`` fields."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        with self._connect() as db:
            db.execute(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def load(self, thread_id: str) -> list[dict[str, Any]]:
        db = self._connect()
        try:
            rows = db.execute("SELECT body FROM messages WHERE thread_id = ? ORDER BY seq", (thread_id,))
            return [json.loads(body) for (body,) in rows]
        finally:
            db.close()

    def append(self, thread_id: str, messages: list[dict[str, Any]]) -> None:
        """Append *messages* at once (all or none)."""
        db = self._connect()
        try:
            with db:
                (seq,) = db.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM messages WHERE thread_id = ?",
                                    (thread_id,)).fetchone()  # fmt: skip
                db.executemany("INSERT INTO messages (thread_id, seq, body) VALUES (?, ?, ?)",
                               [(thread_id, seq + i, json.dumps(m)) for i, m in enumerate(messages)])  # fmt: skip
        finally:
            db.close()
