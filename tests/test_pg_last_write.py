"""PostgreSQL: a run waiting for the run lock reads the state the releasing run's last write left (#48, "a contest
at the run's last write"). The run's last write and the lock's release go in one round trip (write, lease release,
COMMIT, unlock); here the COMMIT is slowed on purpose (a deferred trigger in the test's own schema sleeps at
commit), so that a release that came before the commit would let the waiter in while the write is not visible."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tenxgraph.storage.checkpointer.base import hold_run_lock
from tenxgraph.storage.checkpointer.pg import PgCheckpointer
from tenxgraph.storage.checkpointer.pg_run_lock import PgRunLocks
from tenxgraph.utils.sync import run_sync

SLOW_COMMIT = """
CREATE OR REPLACE FUNCTION {schema}.slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(0.5); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON {schema}.threads DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW EXECUTE FUNCTION {schema}.slow_commit();
"""


def contest(cp: PgCheckpointer, waiter: PgCheckpointer) -> tuple[int, tuple[int, Any]]:
    """A run writes its last state (slow to commit) while another waits for the lock: the last version, and the
    version and values the waiter read once it held the lock."""

    async def body() -> tuple[int, tuple[int, Any]]:
        async with hold_run_lock(cp, "t", None) as session:
            first = await session.write({"n": 1}, expected_version=0, new_messages=[])

            async def wait() -> tuple[int, Any]:
                async with hold_run_lock(waiter, "t", 10):
                    snap = await waiter.aget_thread("t")
                    assert snap is not None
                    return snap.version, snap.values

            waiting = asyncio.ensure_future(wait())
            await asyncio.sleep(0.2)  # the waiter is refused, and tries again
            session.next_write_is_last()
            last = await session.write({"n": 2}, expected_version=first, new_messages=[])
        return last, await waiting

    return run_sync(body())


def contest_beside(cp: PgCheckpointer, dsn: str, schema: str) -> tuple[int, tuple[int, Any]]:
    """:func:`contest` with a waiter of its own (another worker's checkpointer on the same schema)."""
    waiter = PgCheckpointer(postgres_dsn=dsn, schema=schema)
    try:
        return contest(cp, waiter)
    finally:
        waiter.close()


def lease_released(self: Any, thread_id: str) -> Any:
    """The lease of *thread_id*, taken off the renewer, as the real release does first."""
    lease = self.leases[thread_id]
    if self.renewer is not None:
        self.renewer.remove(lease)
    return lease


@pytest.fixture
def slow_commits(pg_checkpointer: PgCheckpointer, pg_dsn: str, pg_schema: str) -> PgCheckpointer:
    pg_checkpointer.get_thread("setup")  # (its tables exist)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(SLOW_COMMIT).format(schema=sql.Identifier(pg_schema)))
    return pg_checkpointer


def test_a_run_waiting_for_the_lock_reads_the_last_write_of_the_run_that_released_it(
    slow_commits: PgCheckpointer, pg_dsn: str, pg_schema: str
) -> None:
    last, seen = contest_beside(slow_commits, pg_dsn, pg_schema)
    assert seen == (last, {"n": 2})


def test_even_an_unlock_sent_before_the_commit_keeps_the_waiter_behind_the_lease(
    slow_commits: PgCheckpointer, pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the order of COMMIT and unlock in that round trip cannot show in a contest: a waiter that gets the
    advisory lock still claims the lease, whose row the releasing transaction holds until it commits. Measured
    with the unlock sent first: the waiter still reads the last write."""

    async def unlock_first(self: Any, conn: Any, thread_id: str, query: str, params: Any) -> Any:
        lease = lease_released(self, thread_id)
        async with conn.pipeline():
            await conn.execute("BEGIN")
            cur = await conn.execute(query, params)
            await conn.execute(self.q["release_lease"], (thread_id, lease.owner))
            await conn.execute(self.q["unlock"], (lease.key,))
            await conn.execute("COMMIT")
        self.unlock_with_write[thread_id] = "released"
        return cur

    monkeypatch.setattr(PgRunLocks, "write_and_release", unlock_first)
    last, seen = contest_beside(slow_commits, pg_dsn, pg_schema)
    assert seen == (last, {"n": 2})


def test_a_release_sent_before_the_write_lets_the_waiter_read_the_state_before_it(
    slow_commits: PgCheckpointer, pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The contest sees a release that does not wait for the write: the lease released and the lock unlocked,
    then the write (a broken runtime), lets the waiter in to read the state the last write was about to replace."""

    async def release_first(self: Any, conn: Any, thread_id: str, query: str, params: Any) -> Any:
        lease = lease_released(self, thread_id)
        await conn.execute(self.q["release_lease"], (thread_id, lease.owner))
        await conn.execute(self.q["unlock"], (lease.key,))
        await asyncio.sleep(0.2)  # (the waiter's next try comes now)
        async with conn.pipeline():
            await conn.execute("BEGIN")
            cur = await conn.execute(query, params)
            await conn.execute("COMMIT")
        self.unlock_with_write[thread_id] = "released"
        return cur

    monkeypatch.setattr(PgRunLocks, "write_and_release", release_first)
    last, seen = contest_beside(slow_commits, pg_dsn, pg_schema)
    assert seen == (last - 1, {"n": 1})  # the waiter read the state before the last write: the contest shows it
