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
    # The run lease (see pg_lease): who runs the thread, from which process, until when (renewed while it runs).
    3: [
        """CREATE TABLE IF NOT EXISTS {schema}.run_leases (
            thread_id  TEXT PRIMARY KEY,
            owner      TEXT NOT NULL,
            host       TEXT NOT NULL,
            pid        INTEGER NOT NULL,
            pid_start  BIGINT NOT NULL,
            taken_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
            expires_at TIMESTAMPTZ NOT NULL
        )"""
    ],
}

# The run lease's statements (see pg_lease). The advisory lock is taken in the same statement (a MATERIALIZED CTE
# is evaluated once): the lease is claimed only when it was granted, and the row as it was comes back with it.
_LEASE_PREVIOUS = """SELECT owner, host, pid, pid_start, expires_at > now() AS live,
            extract(epoch FROM expires_at - now())::float8 AS left_s
        FROM {schema}.run_leases WHERE thread_id = %(t)s"""


QUERIES = {
    "get_thread": "SELECT version, state FROM {schema}.threads WHERE thread_id = %s",
    "list_running": """SELECT thread_id FROM {schema}.threads WHERE state->'meta'->>'status' = 'running'
        ORDER BY updated_at LIMIT %s""",
    "count_status": "SELECT count(*) FROM {schema}.threads WHERE state->'meta'->>'status' = %s",
    # CAS + messages in one statement (see _MESSAGES_AFTER_WRITE).
    "create_thread": """
        WITH w AS (
            INSERT INTO {schema}.threads (thread_id, version, state)
            VALUES (%s, 1, %s::text::jsonb)
            ON CONFLICT (thread_id) DO NOTHING
            RETURNING version
"""
    + _MESSAGES_AFTER_WRITE,
    # A new thread's start, sent in the run lock's round trip (pg_first_reads): written only if this run's lease
    # was claimed in the same transaction (a refused run writes nothing) and the thread does not exist yet.
    "create_thread_locked": """
        WITH w AS (
            INSERT INTO {schema}.threads (thread_id, version, state)
            SELECT %s, 1, %s::text::jsonb
            WHERE EXISTS (SELECT 1 FROM {schema}.run_leases WHERE thread_id = %s AND owner = %s)
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
    # The run lock and its lease: the lease is taken only when it is free or has expired (or is this run's own:
    # a retried claim whose first attempt committed).
    "claim_lease": """
        WITH lock AS MATERIALIZED (SELECT pg_try_advisory_lock(%(key)s::bigint) AS got),
        prev AS MATERIALIZED ("""
    + _LEASE_PREVIOUS
    + """),
        claim AS (
            INSERT INTO {schema}.run_leases AS l (thread_id, owner, host, pid, pid_start, expires_at)
            SELECT %(t)s, %(owner)s, %(host)s, %(pid)s, %(start)s, now() + %(lease)s * interval '1 second'
            FROM lock WHERE lock.got
            ON CONFLICT (thread_id) DO UPDATE SET owner = EXCLUDED.owner, host = EXCLUDED.host, pid = EXCLUDED.pid,
                pid_start = EXCLUDED.pid_start, taken_at = now(), expires_at = EXCLUDED.expires_at
            WHERE l.expires_at <= now() OR l.owner = EXCLUDED.owner
            RETURNING owner
        )
        SELECT lock.got, (SELECT count(*) FROM claim) > 0, prev.owner, prev.host, prev.pid, prev.pid_start,
            prev.live, prev.left_s
        FROM lock LEFT JOIN prev ON true""",
    # After a blip: the lock again on a new connection, and the lease extended, only if it is still this run's.
    "reclaim_lease": """
        WITH lock AS MATERIALIZED (SELECT pg_try_advisory_lock(%(key)s::bigint) AS got),
        prev AS MATERIALIZED ("""
    + _LEASE_PREVIOUS
    + """),
        renewed AS (
            UPDATE {schema}.run_leases SET expires_at = now() + %(lease)s * interval '1 second'
            WHERE thread_id = %(t)s AND owner = %(owner)s AND (SELECT got FROM lock)
            RETURNING owner
        )
        SELECT lock.got, (SELECT count(*) FROM renewed) > 0, prev.owner, prev.host, prev.pid, prev.pid_start,
            prev.live, prev.left_s
        FROM lock LEFT JOIN prev ON true""",
    # The lease of a holder known dead (its process is gone), taken while this run holds the advisory lock.
    "take_lease": """
        UPDATE {schema}.run_leases SET owner = %(owner)s, host = %(host)s, pid = %(pid)s, pid_start = %(start)s,
            taken_at = now(), expires_at = now() + %(lease)s * interval '1 second'
        WHERE thread_id = %(t)s AND owner = %(from)s
        RETURNING owner""",
    "renew_leases": """
        UPDATE {schema}.run_leases SET expires_at = now() + %s * interval '1 second'
        WHERE thread_id = ANY(%s) AND owner = ANY(%s)
        RETURNING owner""",
    "release_lease": "DELETE FROM {schema}.run_leases WHERE thread_id = %s AND owner = %s",
    "unlock": "SELECT pg_advisory_unlock(%s::bigint)",
    "prune": """
        DELETE FROM {schema}.tool_executions WHERE ctid IN (
            SELECT te.ctid FROM {schema}.tool_executions te
            WHERE te.created_at < now() - %s::interval
              AND (%s OR te.thread_id = ANY(%s) OR EXISTS (
                  SELECT 1 FROM {schema}.threads t
                  WHERE t.thread_id = te.thread_id
                    AND NOT coalesce(t.state->'meta'->>'status', '') = ANY(%s)))
            LIMIT %s)""",
    "delete_results": "DELETE FROM {schema}.tool_executions WHERE thread_id = %s",
    "delete_messages": "DELETE FROM {schema}.messages WHERE thread_id = %s",
    "delete_thread": "DELETE FROM {schema}.threads WHERE thread_id = %s",
}


def json_rows(name: str, value: str, pairs: Sequence[tuple[str, str]]) -> str:
    """``[{name: key, value: <json>}, ...]`` as JSON text, from keys and JSON texts already encoded (and checked):
    one query parameter, joined without decoding or re-encoding the values."""
    return "[" + ",".join(f'{{"{name}":{json.dumps(key)},"{value}":{text}}}' for key, text in pairs) + "]"
