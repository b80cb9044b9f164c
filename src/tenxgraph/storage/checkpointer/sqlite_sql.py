"""SqliteCheckpointer's SQL, as named text: the forward migrations of its schema and the statements it shares
between methods. Every value is a ``?`` parameter; no SQL is built from input."""

from __future__ import annotations

import sqlite3

SCHEMA = """
CREATE TABLE IF NOT EXISTS threads (
    thread_id  TEXT PRIMARY KEY,
    version    INTEGER NOT NULL,
    state      TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    thread_id  TEXT NOT NULL,
    message_id TEXT NOT NULL,
    data       TEXT NOT NULL,
    UNIQUE (thread_id, message_id)
);
CREATE TABLE IF NOT EXISTS tool_executions (
    thread_id  TEXT NOT NULL,
    key        TEXT NOT NULL,
    result     TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (thread_id, key)
);
CREATE INDEX IF NOT EXISTS tool_executions_created_at ON tool_executions (created_at);
"""
# Forward migrations by PRAGMA user_version: what to run to reach each version.
MIGRATIONS: dict[int, list[str]] = {
    1: [s for s in SCHEMA.split(";") if s.strip()],
    2: ["ALTER TABLE tool_executions ADD COLUMN status TEXT NOT NULL DEFAULT 'completed'"],
    3: ["CREATE INDEX IF NOT EXISTS messages_thread_seq ON messages (thread_id, seq)"],
    # The run lease: which process runs the thread (written with the run's first state write, deleted with its
    # last), so that a lock file another process removed does not let a second run in while the first lives.
    4: [
        "CREATE TABLE IF NOT EXISTS run_leases (thread_id TEXT PRIMARY KEY, owner TEXT NOT NULL, host TEXT NOT NULL, "
        "pid INTEGER NOT NULL, pid_start INTEGER NOT NULL)"
    ],
}
PUT_RESULT = (
    "INSERT INTO tool_executions (thread_id, key, result, created_at, status) VALUES (?, ?, ?, ?, 'completed') "
    "ON CONFLICT (thread_id, key) DO UPDATE SET result = excluded.result, created_at = excluded.created_at, "
    "status = 'completed' WHERE tool_executions.status = 'started'"
)
MAX_VARS = 500  # keys per IN (...) list, well under SQLite's variable limit
PRUNE = """
DELETE FROM tool_executions WHERE rowid IN (
    SELECT te.rowid FROM tool_executions te
    WHERE te.created_at < ?
      AND (? OR te.thread_id IN (SELECT value FROM json_each(?)) OR EXISTS (
          SELECT 1 FROM threads t
          WHERE t.thread_id = te.thread_id
            AND coalesce(json_extract(t.state, '$.meta.status'), '') NOT IN (?, ?, ?)))
    LIMIT ?)
"""


def insert_messages(conn: sqlite3.Connection, thread_id: str, encoded: list[tuple[str, str]]) -> None:
    conn.executemany(
        "INSERT INTO messages (thread_id, message_id, data) VALUES (?, ?, ?) "
        "ON CONFLICT (thread_id, message_id) DO NOTHING",
        [(thread_id, mid, text) for mid, text in encoded],
    )
