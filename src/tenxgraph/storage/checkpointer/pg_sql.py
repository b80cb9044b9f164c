"""PgCheckpointer's SQL, as named text: the forward migrations of its schema and every statement it runs.

``{schema}`` is filled in once per checkpointer with a validated identifier (``sql.Identifier``); every value is a
``%s`` parameter. No SQL is ever built from input."""

from __future__ import annotations

import json
from collections.abc import Sequence

# The new messages of a state write, in the same statement: the CTE reads from the write ``w``, so a lost
# compare-and-swap stores nothing. They travel as one JSON array parameter ([{"id": ..., "data": {...}}, ...], see
# json_rows): no per-element array escaping on the client.
_MESSAGES_AFTER_WRITE = """        ), m AS (
            INSERT INTO {schema}.messages (thread_id, message_id, data)
            SELECT %s, u.e->>'id', u.e->'data' FROM w, jsonb_array_elements(%s::text::jsonb) WITH ORDINALITY AS u(e, n)
            ORDER BY u.n
            ON CONFLICT (thread_id, message_id) DO NOTHING
        )
        SELECT version FROM w"""

MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE IF NOT EXISTS {schema}.threads (
            thread_id  TEXT PRIMARY KEY,
            version    BIGINT NOT NULL,
            state      JSONB NOT NULL,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )""",
        """CREATE TABLE IF NOT EXISTS {schema}.messages (
            thread_id  TEXT NOT NULL,
            message_id TEXT NOT NULL,
            seq        BIGSERIAL NOT NULL,
            data       JSONB NOT NULL,
            PRIMARY KEY (thread_id, message_id)
        )""",
        "CREATE INDEX IF NOT EXISTS messages_thread_seq ON {schema}.messages (thread_id, seq)",
        """CREATE TABLE IF NOT EXISTS {schema}.tool_executions (
            thread_id  TEXT NOT NULL,
            key        TEXT NOT NULL,
            result     JSONB NOT NULL,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY (thread_id, key)
        )""",
        "CREATE INDEX IF NOT EXISTS tool_executions_created_at ON {schema}.tool_executions (created_at)",
    ],
    # status: 'started' for an intent written before an opted-in tool runs, 'completed' for a result
    2: ["ALTER TABLE {schema}.tool_executions ADD COLUMN IF NOT EXISTS status TEXT NOT NULL DEFAULT 'completed'"],
}


QUERIES = {
    "get_thread": "SELECT version, state FROM {schema}.threads WHERE thread_id = %s",
    "list_running": """SELECT thread_id FROM {schema}.threads WHERE state->'meta'->>'status' = 'running'
        ORDER BY updated_at LIMIT %s""",
    # CAS + messages in one statement (see _MESSAGES_AFTER_WRITE).
    "create_thread": """
        WITH w AS (
            INSERT INTO {schema}.threads (thread_id, version, state)
            VALUES (%s, 1, %s::text::jsonb)
            ON CONFLICT (thread_id) DO NOTHING
            RETURNING version
"""
    + _MESSAGES_AFTER_WRITE,
    "update_thread": """
        WITH w AS (
            UPDATE {schema}.threads SET version = version + 1, state = %s::text::jsonb, updated_at = now()
            WHERE thread_id = %s AND version = %s
            RETURNING version
"""
    + _MESSAGES_AFTER_WRITE,
    "list_messages": "SELECT data FROM {schema}.messages WHERE thread_id = %s ORDER BY seq",
    # One statement, one snapshot: the thread's count and highest seq, then the rows after a seq (none: NULLs).
    "list_messages_after": """
        WITH log AS (
            SELECT count(*) AS n, coalesce(max(seq), 0) AS last FROM {schema}.messages WHERE thread_id = %(t)s
        )
        SELECT log.n, log.last, m.seq, m.data FROM log
        LEFT JOIN {schema}.messages m ON m.thread_id = %(t)s AND m.seq > %(after)s
        ORDER BY m.seq""",
    "append_messages": """
        INSERT INTO {schema}.messages (thread_id, message_id, data)
        SELECT %s, u.e->>'id', u.e->'data' FROM jsonb_array_elements(%s::text::jsonb) WITH ORDINALITY AS u(e, n)
        ORDER BY u.n
        ON CONFLICT (thread_id, message_id) DO NOTHING""",
    "get_results": "SELECT key, result FROM {schema}.tool_executions WHERE thread_id = %s AND key = ANY(%s)",
    "put_result": """
        INSERT INTO {schema}.tool_executions (thread_id, key, result, status)
        VALUES (%s, %s, %s::text::jsonb, 'completed')
        ON CONFLICT (thread_id, key) DO UPDATE SET result = EXCLUDED.result, status = 'completed', created_at = now()
        WHERE {schema}.tool_executions.status = 'started'""",
    # The group commit: several records in one statement (one transaction); RETURNING names those written.
    "put_results": """
        INSERT INTO {schema}.tool_executions (thread_id, key, result, status)
        SELECT %(t)s, r.e->>'key', r.e->'result', 'completed' FROM jsonb_array_elements(%(rows)s::text::jsonb) AS r(e)
        ON CONFLICT (thread_id, key) DO UPDATE SET result = EXCLUDED.result, status = 'completed', created_at = now()
        WHERE {schema}.tool_executions.status = 'started'
        RETURNING key""",
    "put_intent": """
        INSERT INTO {schema}.tool_executions (thread_id, key, result, status)
        VALUES (%s, %s, %s::text::jsonb, 'started')
        ON CONFLICT (thread_id, key) DO NOTHING""",
    "list_results": "SELECT key, result FROM {schema}.tool_executions WHERE thread_id = %s ORDER BY created_at, key",
    "try_lock": "SELECT pg_try_advisory_lock(%s::bigint)",
    "unlock": "SELECT pg_advisory_unlock(%s::bigint)",
    "prune": """
        DELETE FROM {schema}.tool_executions WHERE ctid IN (
            SELECT te.ctid FROM {schema}.tool_executions te
            WHERE te.created_at < now() - %s::interval
              AND (%s OR NOT EXISTS (
                  SELECT 1 FROM {schema}.threads t
                  WHERE t.thread_id = te.thread_id AND t.state->'meta'->>'status' = ANY(%s)))
            LIMIT %s)""",
    "delete_results": "DELETE FROM {schema}.tool_executions WHERE thread_id = %s",
    "delete_messages": "DELETE FROM {schema}.messages WHERE thread_id = %s",
    "delete_thread": "DELETE FROM {schema}.threads WHERE thread_id = %s",
}


def json_rows(name: str, value: str, pairs: Sequence[tuple[str, str]]) -> str:
    """``[{name: key, value: <json>}, ...]`` as JSON text, from keys and JSON texts already encoded (and checked):
    one query parameter, joined without decoding or re-encoding the values."""
    return "[" + ",".join(f'{{"{name}":{json.dumps(key)},"{value}":{text}}}' for key, text in pairs) + "]"
