"""A transactional tool's transaction on PostgreSQL (:meth:`PgCheckpointer.atransact`): the ledger read, the tool's
work on the same connection, and its record, committed together; rolled back, writes and all, when another run
recorded the call first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from tenxgraph.state.messages import JSON, dumps


async def transact(
    conn: psycopg.AsyncConnection[Any], q: dict[str, str], thread_id: str, key: str, work: Callable[[Any], Any]
) -> tuple[dict[str, JSON], bool]:
    async with conn.transaction():
        cur = await conn.execute(q["get_results"], (thread_id, [key]))
        row = await cur.fetchone()
        if row is not None and row[1].get("kind") != "intent":
            return row[1], False  # recorded already: the work does not run
        record = await work(conn)
        cur = await conn.execute(q["put_result"], (thread_id, key, dumps(record, f"ledger record {key!r}")))
        if cur.rowcount == 1:
            return record, True  # (leaving the block commits: the writes and the record together)
        raise psycopg.Rollback()  # recorded meanwhile by another run: roll back, writes and all
    cur = await conn.execute(q["get_results"], (thread_id, [key]))  # (theirs, after the rollback)
    row = await cur.fetchone()
    if row is None:  # (cannot happen: it was recorded, and records are never deleted by a run)
        raise RuntimeError(f"ledger record {key!r} of thread {thread_id!r} vanished during its transaction")
    return row[1], False
