"""PgCheckpointer against a real PostgreSQL and Redis: CAS, cache guard, Redis loss, dropped connections, kill -9."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from psycopg import sql

from examples.payments import LocalProvider
from examples.support_refund.agent import build_support_agent
from pytest_replaysafe.matrix import services
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel
from tenxgraph.core import crashpoints
from tenxgraph.core.crashpoints import CrashInjected
from tenxgraph.errors import ConfigError, RunLockLostError, StaleStateError, StorageConnectionError, ThreadBusyError
from tenxgraph.storage.checkpointer.base import hold_run_lock
from tenxgraph.storage.checkpointer.pg import PgCheckpointer
from tenxgraph.utils.sync import run_sync
from tests.test_crashpoints import effects, run_child

MSG = {"messages": [Message.text_message("refund order 1042")]}


def counting_agent(cp: PgCheckpointer, runs: Counter[str]) -> Any:
    def refund_order(order_id: str) -> str:
        """Refund."""
        runs["refund_order"] += 1
        return f"refunded {order_id}"

    script = [Reply(tool_calls=[("refund_order", {"order_id": "1042"})]), "done"]
    return ReactAgent(ScriptedModel(script), tools=[refund_order]).compile(cp)


@pytest.mark.parametrize("schema", ["", "1abc", "a-b", "x; DROP TABLE y", "a" * 64, "Ünï"])
def test_schema_must_be_an_identifier(schema: str) -> None:
    with pytest.raises(ConfigError, match="not a valid PostgreSQL identifier"):
        PgCheckpointer(postgres_dsn="postgresql://localhost/x", schema=schema)


def test_constructor_errors_are_clear() -> None:
    with pytest.raises(ConfigError, match="exactly one of postgres_dsn= or pool="):
        PgCheckpointer()
    with pytest.raises(ConfigError, match="cache_ttl"):
        PgCheckpointer(postgres_dsn="postgresql://localhost/x", cache_ttl=-1)


def test_missing_driver_names_the_extra() -> None:
    code = "import sys; sys.modules['psycopg'] = None\nfrom tenxgraph.storage.checkpointer import PgCheckpointer"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode != 0
    assert 'pip install ".[pg-checkpoint]" in a tenxgraph checkout' in out.stderr


def test_setup_is_idempotent_and_safe_concurrently(pg_dsn: str, pg_schema: str) -> None:
    errors: list[BaseException] = []

    def one() -> None:
        cp = PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema, auto_setup=False)
        try:
            asyncio.run(_setup_and_close(cp))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(sql.SQL("SELECT version FROM {}.schema_version").format(sql.Identifier(pg_schema)))
        assert [r[0] for r in rows] == [1, 2, 3]
        cols = conn.execute(
            "SELECT data_type FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = 'tool_executions' AND column_name = 'key'",
            (pg_schema,),
        ).fetchone()
        assert cols == ("text",)


async def _setup_and_close(cp: PgCheckpointer) -> None:
    await cp.asetup()
    await cp.asetup()
    await cp.aclose()


def test_accepts_an_existing_pool_and_redis_client(pg_dsn: str, redis_url: str, pg_schema: str) -> None:
    import redis.asyncio as aioredis
    from psycopg_pool import AsyncConnectionPool

    async def main() -> None:
        pool = AsyncConnectionPool(pg_dsn, open=False, kwargs={"autocommit": True})
        await pool.open()
        client = aioredis.from_url(redis_url)
        cp = PgCheckpointer(pool=pool, redis=client, schema=pg_schema)
        try:
            await cp.aput_thread("t", {"x": 1}, expected_version=0)
            await cp.aflush_cache_writes()
            cached = await cp.aget_cached_thread("t")
            assert cached is not None and cached.values == {"x": 1}
            await cp.aclose()
            assert not pool.closed  # a pool the caller passed in stays the caller's
        finally:
            await pool.close()
            await client.aclose()
            services.delete_redis_keys(redis_url, cp.cache_prefix)  # the key this test wrote

    asyncio.run(main())


def test_cas_rejects_the_loser_of_concurrent_writers(pg_checkpointer: PgCheckpointer) -> None:
    """Real concurrency: 6 writers on separate connections race from the same version, 40 trials."""

    async def trials() -> list[int]:
        winners = []
        await pg_checkpointer.aput_thread("t", {"trial": -1}, expected_version=0)
        version = 1
        for trial in range(40):
            attempts = [
                pg_checkpointer.aput_thread("t", {"trial": trial, "writer": w}, expected_version=version)
                for w in range(6)
            ]
            outcomes = await asyncio.gather(*attempts, return_exceptions=True)
            won = [i for i, o in enumerate(outcomes) if not isinstance(o, BaseException)]
            lost = [o for o in outcomes if isinstance(o, StaleStateError)]
            assert len(won) == 1 and len(lost) == 5, outcomes
            assert all((e.expected, e.actual) == (version, version + 1) for e in lost)
            snap = await pg_checkpointer.aget_thread("t")
            assert snap is not None and snap.values == {"trial": trial, "writer": won[0]}
            version += 1
            winners.append(won[0])
        return winners

    assert len(run_sync(trials())) == 40


def test_stale_cache_write_is_refused(pg_redis_checkpointer: PgCheckpointer) -> None:
    cp = pg_redis_checkpointer

    async def main() -> None:
        assert await cp.acache_put("t", 5, json.dumps({"v": 5}))
        assert not await cp.acache_put("t", 4, json.dumps({"v": 4}))  # older: refused
        assert not await cp.acache_put("t", 5, json.dumps({"v": "other 5"}))  # same version: refused
        cached = await cp.aget_cached_thread("t")
        assert cached is not None and (cached.version, cached.values) == (5, {"v": 5})
        assert await cp.acache_put("t", 6, json.dumps({"v": 6}))

    run_sync(main())


def test_losing_run_cannot_regress_the_cache(pg_redis_checkpointer: PgCheckpointer) -> None:
    cp = pg_redis_checkpointer

    async def main() -> None:
        await cp.aput_thread("t", {"by": "a"}, expected_version=0)
        await cp.aput_thread("t", {"by": "winner"}, expected_version=1)
        with pytest.raises(StaleStateError):
            await cp.aput_thread("t", {"by": "stale run"}, expected_version=1)
        await cp.aflush_cache_writes()
        # the winner's cache write may complete after a slower stale one; replay one explicitly, out of order
        assert not await cp.acache_put("t", 1, json.dumps({"by": "a"}))
        cached = await cp.aget_cached_thread("t")
        assert cached is not None and (cached.version, cached.values) == (2, {"by": "winner"})

    run_sync(main())


def test_resume_after_the_cache_is_emptied_uses_postgres(pg_redis_checkpointer: PgCheckpointer, redis_url: str) -> None:
    """The cache loses everything (as after a Redis restart): deleted here key by key under this checkpointer's
    own prefix, never the whole database, which may hold the user's data; a key outside the prefix survives."""
    runs: Counter[str] = Counter()
    client = redis.Redis.from_url(redis_url)
    bystander = f"replaysafe-test-bystander:{uuid.uuid4().hex}"
    client.set(bystander, "user data", ex=600)
    counting_agent(pg_redis_checkpointer, Counter()).invoke(MSG, {"thread_id": "finished"})
    with crashpoints.armed("tool.after_record", hit=1), pytest.raises(CrashInjected):
        counting_agent(pg_redis_checkpointer, runs).invoke(MSG, {"thread_id": "t"})
    keys_before = set(pg_redis_checkpointer.list_tool_results("t"))
    run_sync(pg_redis_checkpointer.aflush_cache_writes())
    ours = list(client.scan_iter(match=pg_redis_checkpointer.cache_prefix + "*"))
    assert ours and all(k.decode().startswith(pg_redis_checkpointer.cache_prefix) for k in ours)
    assert [k.decode() for k in ours] == [pg_redis_checkpointer.cache_key("finished")]  # runs end cached, not steps
    client.delete(*ours)
    assert client.get(bystander) == b"user data"
    client.delete(bystander)
    snap = pg_redis_checkpointer.get_thread("t")
    assert snap is not None and snap.values["meta"]["current_node"] == "TOOL"
    result = counting_agent(pg_redis_checkpointer, runs).invoke(None, {"thread_id": "t"})
    assert runs["refund_order"] == 1 and result.final_text == "done"
    assert set(pg_redis_checkpointer.list_tool_results("t")) == keys_before


def test_resume_with_redis_unreachable(
    pg_dsn: str, redis_url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    runs: Counter[str] = Counter()
    first = PgCheckpointer(postgres_dsn=pg_dsn, redis_url=redis_url, schema=pg_schema)
    try:
        with crashpoints.armed("tool.after_record", hit=1), pytest.raises(CrashInjected):
            counting_agent(first, runs).invoke(MSG, {"thread_id": "t"})
    finally:
        first.close()
        services.delete_redis_keys(redis_url, first.cache_prefix)  # (the keys it wrote: this test's own)
    # Redis is gone (nothing listens on port 1): the run resumes from PostgreSQL and only warns
    down = PgCheckpointer(postgres_dsn=pg_dsn, redis_url="redis://127.0.0.1:1/0", schema=pg_schema)
    with caplog.at_level(logging.WARNING, logger="tenxgraph"):
        result = counting_agent(down, runs).invoke(None, {"thread_id": "t"})
        run_sync(down.aflush_cache_writes())
    assert runs["refund_order"] == 1 and result.final_text == "done" and result.status == "done"
    assert "Redis cache write for thread 't'" in caplog.text
    cached = run_sync(down.aget_cached_thread("t"))  # falls back to PostgreSQL
    assert cached is not None and cached.values["meta"]["status"] == "done"
    down.close()


def _terminate(pg_dsn: str, where: str, params: tuple[Any, ...]) -> int:
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        rows = admin.execute(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND {where}",
            params,
        ).fetchall()
        return len(rows)


def test_idle_connections_beyond_the_first_close_after_pool_max_idle(pg_dsn: str, pg_schema: str) -> None:
    """A burst of 4 concurrent statements grows the pool to 4; with ``pool_max_idle=0.2`` it shrinks back towards
    its first connection once they are idle (psycopg's ``max_idle``: one per period). Bad values are refused."""
    with pytest.raises(ConfigError, match="pool_max_idle must be a number of seconds > 0, got 0"):
        PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema, pool_max_idle=0)
    with pytest.raises(ConfigError, match="max_pool_size must be a whole number >= 1, got 0"):
        PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema, max_pool_size=0)
    cp = PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema, pool_max_idle=0.2)

    async def burst() -> tuple[int, int]:
        async def hold() -> None:
            async with cp.connection() as conn:
                await conn.execute("SELECT pg_sleep(0.3)")

        await asyncio.gather(*(hold() for _ in range(4)))
        pool = await cp._ensure_open()
        grown = pool.get_stats()["pool_size"]
        for _ in range(50):  # (up to 5 s; about 1 s on an idle machine)
            await asyncio.sleep(0.1)
            if pool.get_stats()["pool_size"] <= 1:
                break
        return grown, pool.get_stats()["pool_size"]

    grown, after = run_sync(burst())
    assert grown == 4 and after == 1, (grown, after)
    cp.close()


def test_dropped_idle_connection_is_retried(pg_dsn: str, pg_schema: str, caplog: pytest.LogCaptureFixture) -> None:
    cp = PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema, max_pool_size=1)
    cp.put_thread("t", {"n": 1}, expected_version=0)

    async def backend_pid() -> int:
        async with cp.connection() as conn:
            cur = await conn.execute("SELECT pg_backend_pid()")
            row = await cur.fetchone()
            assert row is not None
            return int(row[0])

    pid = run_sync(backend_pid())
    assert _terminate(pg_dsn, "pid = %s", (pid,)) == 1
    with caplog.at_level(logging.WARNING, logger="tenxgraph"):
        snap = cp.get_thread("t")  # first attempt hits the dead connection; the retry succeeds
    assert snap is not None and snap.values == {"n": 1}
    assert "PostgreSQL state read failed" in caplog.text and "retrying" in caplog.text
    cp.close()


def test_connection_terminated_mid_write_is_retried(pg_dsn: str, pg_schema: str) -> None:
    """The CAS write blocks on a row lock; its backend is terminated while it waits; the retry writes once."""
    cp = PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema, max_pool_size=2)
    cp.put_thread("t", {"n": 1}, expected_version=0, new_messages=[Message.user("a")])
    table = sql.Identifier(pg_schema, "threads")
    with psycopg.connect(pg_dsn) as locker:
        locker.execute(sql.SQL("SELECT 1 FROM {} WHERE thread_id = 't' FOR UPDATE").format(table))
        result: dict[str, Any] = {}

        def write() -> None:
            try:
                result["version"] = cp.put_thread(
                    "t", {"n": 2}, expected_version=1, new_messages=[Message.user("b", message_id="msg_b")]
                )
            except BaseException as exc:  # asserted below
                result["error"] = exc

        writer = threading.Thread(target=write)
        writer.start()
        terminated = 0
        for _ in range(200):
            # only this test's writer: other xdist workers may be waiting on their own locks right now
            terminated = _terminate(pg_dsn, "wait_event_type = 'Lock' AND query LIKE %s", (f"%{pg_schema}%threads%",))
            if terminated:
                break
            threading.Event().wait(0.02)
        assert terminated == 1
        locker.rollback()
        writer.join(timeout=30)
    assert result == {"version": 2}
    snap = cp.get_thread("t")
    assert snap is not None and (snap.version, snap.values) == (2, {"n": 2})
    assert [m.text for m in cp.list_messages("t")] == ["a", "b"]
    cp.close()


def test_real_ledger_failures_follow_the_documented_behaviour(
    pg_checkpointer: PgCheckpointer, pg_dsn: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With the ledger table gone, reads warn and run the tool; writes log an error; the run still finishes."""
    runs: Counter[str] = Counter()
    pg_checkpointer.put_thread("warm", {}, expected_version=0)  # schema exists
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(pg_schema, "tool_executions")))
    with caplog.at_level(logging.WARNING, logger="tenxgraph"):
        result = counting_agent(pg_checkpointer, runs).invoke(MSG, {"thread_id": "t"})
    assert result.final_text == "done" and runs["refund_order"] == 1
    levels = {r.levelname for r in caplog.records if "refund_order" in r.getMessage()}
    assert levels == {"WARNING", "ERROR"}
    assert "ledger read failed (UndefinedTable" in caplog.text
    assert "completed but its result was not recorded" in caplog.text


def test_kill_9_child_at_tool_after_record_with_postgres(tmp_path: Path, pg_dsn: str, pg_schema: str) -> None:
    target = f"{pg_dsn}#{pg_schema}"
    killed = run_child(tmp_path, "tool.after_record:2", backend="postgres", target=target)
    assert killed.returncode == -9, killed.stderr
    resumed = run_child(tmp_path, None, backend="postgres", target=target)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "Refunded 20.00 EUR on order 1042."
    assert effects(tmp_path) == ["1042 20.0"]


def test_support_agent_on_postgres_in_process(pg_redis_checkpointer: PgCheckpointer) -> None:
    payments = LocalProvider()
    app = build_support_agent(pg_redis_checkpointer, payments)
    with crashpoints.armed("run.after_advance", hit=3), pytest.raises(CrashInjected):
        app.invoke(MSG, {"thread_id": "t"})
    result = build_support_agent(pg_redis_checkpointer, payments).invoke(None, {"thread_id": "t"})
    assert payments.effects == [("refund", {"order": "1042", "amount": 20.0})]
    assert result.final_text == "Refunded 20.00 EUR on order 1042."


def test_schema_v1_is_migrated_in_place(pg_dsn: str, pg_schema: str) -> None:
    """A database written by schema version 1 (no ledger status) gains the column; its records read as results."""
    from tenxgraph.storage.checkpointer.pg_sql import MIGRATIONS

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        schema = sql.Identifier(pg_schema)
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.schema_version (version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ "
                "NOT NULL DEFAULT now())"
            ).format(schema)
        )
        for statement in MIGRATIONS[1]:
            conn.execute(sql.SQL(statement).format(schema=schema))  # type: ignore[arg-type]
        conn.execute(sql.SQL("INSERT INTO {}.schema_version (version) VALUES (1)").format(schema))
        conn.execute(
            sql.SQL("INSERT INTO {}.tool_executions (thread_id, key, result) VALUES ('t', 'm:c', %s)").format(schema),
            ('{"kind": "value", "output": "old"}',),
        )
    cp = PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema)
    assert cp.get_tool_results("t", ["m:c"]) == {"m:c": {"kind": "value", "output": "old"}}
    assert cp.put_tool_result("t", "m:c", {"output": "new"}) is False  # a migrated record is a completed result
    cp.close()
    with psycopg.connect(pg_dsn) as conn:
        versions = conn.execute(sql.SQL("SELECT version FROM {}.schema_version ORDER BY 1").format(schema))
        assert [r[0] for r in versions] == [1, 2, 3]


def _lock_holder_pid(cp: PgCheckpointer, dsn: str, thread_id: str) -> int:
    key = cp.run_lock_key(thread_id) & 0xFFFFFFFFFFFFFFFF
    with psycopg.connect(dsn, autocommit=True) as admin:
        row = admin.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s::oid AND objid = %s::oid"
            " AND objsubid = 1 AND granted",
            (key >> 32, key & 0xFFFFFFFF),
        ).fetchone()
    assert row is not None, "the run lock is not held"
    return int(row[0])


def _resume_from_another_worker(dsn: str, schema: str, agent: Any, config: dict[str, Any], outcome: list[str]) -> None:
    """Resume the thread as a second worker would (its own checkpointer and event loop): ``outcome`` gets
    "finished", or "refused" when the thread was busy."""

    async def resume() -> None:
        other = PgCheckpointer(postgres_dsn=dsn, schema=schema)
        try:
            await agent(other).ainvoke(None, config)
            outcome.append("finished")
        except ThreadBusyError:
            outcome.append("refused")
        finally:
            await other.aclose()

    asyncio.run(resume())


def test_a_run_whose_lock_connection_drops_keeps_its_thread_and_finishes(pg_dsn: str, pg_schema: str) -> None:
    """The run's lock connection is terminated (a failover, an idle-session killer) while a tool works. Before
    #26 the run stopped (RunLockLostError) and a retry arriving meanwhile took the thread; now its lease keeps the
    thread: the retry is refused, the run takes its lock again on a new connection and finishes, the email once."""
    cp = PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema)
    sent: list[str] = []
    nested: list[str] = []

    def retry_from_another_worker() -> None:
        _resume_from_another_worker(pg_dsn, pg_schema, agent, {"thread_id": "t"}, nested)

    def drop_my_lock_connection() -> str:
        """Check stock (while it works, the database drops this run's lock connection)."""
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (_lock_holder_pid(cp, pg_dsn, "t"),))
        return "in stock"

    def send_email(to: str) -> str:
        """Send an email."""
        sent.append(to)
        if not nested:  # a retry arrives while this call is running
            worker = threading.Thread(target=retry_from_another_worker)
            worker.start()
            worker.join()
        return "sent"

    def agent(checkpointer: PgCheckpointer) -> Any:
        model = ScriptedModel(
            [
                Reply(tool_calls=[("drop_my_lock_connection", {})]),
                Reply(tool_calls=[("send_email", {"to": "ada"})]),
                "Done.",
            ]
        )
        return ReactAgent(model, tools=[drop_my_lock_connection, send_email]).compile(checkpointer)

    try:
        result = agent(cp).invoke(MSG, {"thread_id": "t"})
        assert result.final_text == "Done."
        assert sent == ["ada"] and nested == ["refused"]  # once; a concurrent retry is refused, not let in
    finally:
        cp.close()


def test_a_run_whose_lease_was_taken_invokes_no_more_tools(pg_dsn: str, pg_schema: str) -> None:
    """The run is cut off long enough for its lease to run out and another run takes the thread: when the run
    comes back it must not invoke another tool (its reclaim finds the lease another's): RunLockLostError."""
    cp = PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema)
    sent: list[str] = []

    def lose_my_lease() -> str:
        """Check stock (meanwhile the lease runs out and another run takes it; the lock connection drops)."""
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(f"UPDATE {pg_schema}.run_leases SET owner = 'another-run', pid = 1 WHERE thread_id = 't'")
            admin.execute("SELECT pg_terminate_backend(%s)", (_lock_holder_pid(cp, pg_dsn, "t"),))
        return "in stock"

    def send_email(to: str) -> str:
        """Send an email."""
        sent.append(to)
        return "sent"

    model = ScriptedModel(
        [Reply(tool_calls=[("lose_my_lease", {})]), Reply(tool_calls=[("send_email", {"to": "ada"})]), "Done."]
    )
    app = ReactAgent(model, tools=[lose_my_lease, send_email]).compile(cp)
    try:
        with pytest.raises(RunLockLostError, match=r"lost its run lock .*took its lease"):
            app.invoke(MSG, {"thread_id": "t"})
        assert sent == []  # the run stopped before invoking send_email without its lease
    finally:
        cp.close()


def test_run_locks_of_unrelated_threads_do_not_collide(pg_checkpointer: PgCheckpointer) -> None:
    """With a 32-bit hashtext key these two ids took the same lock: one got ThreadBusyError while the other ran."""

    async def main() -> None:
        async with pg_checkpointer.arun_lock("order-3687"), pg_checkpointer.arun_lock("order-118181"):
            assert pg_checkpointer.run_lock_key("order-3687") != pg_checkpointer.run_lock_key("order-118181")

    run_sync(main())


def test_the_old_lock_key_did_collide(pg_dsn: str) -> None:
    """Keeps the regression honest: the two ids really collide under the old 32-bit key."""
    with psycopg.connect(pg_dsn) as conn:
        a, b = conn.execute("SELECT hashtext('order-3687'), hashtext('order-118181')").fetchone()  # type: ignore[misc]
    assert a == b


def test_a_role_the_server_refuses_fails_at_once_with_the_servers_reason(pg_dsn: str, pg_schema: str) -> None:
    """Before: PoolTimeout after 30 s, the cause only in pool warnings."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    bad = make_conninfo(**{**conninfo_to_dict(pg_dsn), "user": "nobody_at_all"})
    cp = PgCheckpointer(postgres_dsn=bad, schema=pg_schema)
    started = time.monotonic()
    with pytest.raises(StorageConnectionError, match=r'role "nobody_at_all" does not exist.*not retried'):
        cp.get_thread("t")
    assert time.monotonic() - started < 5


def test_an_unreachable_server_fails_within_the_retry_budget_it_names() -> None:
    cp = PgCheckpointer(postgres_dsn="postgresql://postgres@127.0.0.1:1/test", retries=1, connect_timeout=1)
    started = time.monotonic()
    with pytest.raises(StorageConnectionError, match=r"in 2 attempts \(connect_timeout=1s, retries=1\)"):
        cp.get_thread("t")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"postgres_dsn": "host=localhost port", "redis_url": None}, "postgres_dsn is not a valid connection"),
        ({"postgres_dsn": "postgresql://localhost/db", "redis_url": "htp://nope"}, "is not a Redis URL"),
        ({"postgres_dsn": "postgresql://localhost/db", "retries": -1}, "retries must be"),
        ({"postgres_dsn": "postgresql://localhost/db", "connect_timeout": 0}, "connect_timeout must be"),
    ],
)
def test_malformed_settings_are_rejected_at_construction(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PgCheckpointer(**kwargs)


def test_only_transient_errors_are_retried() -> None:
    from psycopg import errors
    from psycopg_pool import PoolTimeout

    from tenxgraph.storage.checkpointer.pg_connect import is_transient

    assert is_transient(psycopg.OperationalError("connection refused"))  # no SQLSTATE: the network
    assert is_transient(errors.AdminShutdown()) and is_transient(errors.SerializationFailure())
    assert is_transient(PoolTimeout())
    assert not is_transient(errors.ProgramLimitExceeded())  # an index row too large fails the same way again
    assert not is_transient(errors.InvalidAuthorizationSpecification())
    assert not is_transient(psycopg.DataError())
    assert not is_transient(psycopg.OperationalError('connection failed: FATAL:  role "x" does not exist'))
    assert is_transient(psycopg.OperationalError("connection failed: FATAL:  the database system is starting up"))


def test_a_missing_driver_is_reported_as_a_driver_not_a_server_that_is_down() -> None:
    """Before: 'postgresql://... did not answer: ModuleNotFoundError: No module named psycopg'."""
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "from pytest_replaysafe.matrix import services\n"
        "print(services.start_postgres().reason)"
    )
    env = {**os.environ, "REPLAYSAFE_PG_DSN": "postgresql://postgres@127.0.0.1:5432/test"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert "driver is not installed (psycopg)" in out
    assert 'pip install ".[pg-checkpoint]" in a tenxgraph checkout' in out
    assert "did not answer" not in out


def test_the_ci_extra_brings_the_plugins_drivers_and_xdist() -> None:
    from importlib.metadata import requires

    ci = [r for r in requires("tenxgraph") or [] if r.replace('"', "'").endswith("extra == 'ci'")]
    assert any(r.startswith("pytest-xdist") for r in ci) and any(r.startswith("pytest>") for r in ci)
    assert any("pg-checkpoint" in r or "psycopg" in r for r in ci)


def test_a_schema_newer_than_this_code_is_refused(pg_dsn: str, pg_schema: str) -> None:
    first, second = (PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema) for _ in range(2))
    try:
        first.setup()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            table = sql.Identifier(pg_schema, "schema_version")
            conn.execute(sql.SQL("INSERT INTO {} (version) VALUES (99)").format(table))
        with pytest.raises(ConfigError, match=r"at schema version 99, newer than this 10xgraph's \(3\); upgrade"):
            second.get_thread("t")
    finally:
        first.close()
        second.close()


def test_a_forked_child_that_closes_first_forgets_the_parents_run_locks(pg_checkpointer: PgCheckpointer) -> None:
    """A child that closes its inherited checkpointer before using it (a worker's clean start) closes nothing of
    the parent's, and its next run takes locks of its own: the parent's run locks, and their renewer thread, stay
    the parent's."""
    pg_checkpointer.put_thread("t", {"n": 1}, expected_version=0)
    parents = pg_checkpointer._locks
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status, never return into pytest
        code = 1
        try:
            pg_checkpointer.close()
            snap = pg_checkpointer.get_thread("t")
            code = 0 if pg_checkpointer._locks is not parents and snap is not None and snap.values == {"n": 1} else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert pg_checkpointer._locks is parents and pg_checkpointer.get_thread("t") is not None  # the parent's, intact


def test_a_forked_child_neither_probes_nor_sets_up_the_schema_again(
    pg_checkpointer: PgCheckpointer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crash matrix forks a child per SIGKILL cell: it opens its own pool, but its parent already connected and
    set the schema up, so the child skips the probe connection and the migration check (statements it never needs).
    """
    from tenxgraph.storage.checkpointer import pg_connect

    pg_checkpointer.put_thread("t", {"n": 1}, expected_version=0)  # the parent connects and sets up
    calls: list[str] = []

    async def probe(*args: Any) -> None:
        calls.append("probe")

    async def setup(pool: Any) -> None:
        calls.append("setup")

    monkeypatch.setattr(pg_connect, "probe", probe)
    monkeypatch.setattr(pg_checkpointer._pool, "setup", setup)
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status, never return into pytest
        code = 1
        try:
            snap = pg_checkpointer.get_thread("t")
            code = 0 if snap is not None and snap.values == {"n": 1} and not calls else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    fresh = PgCheckpointer(postgres_dsn=pg_checkpointer.postgres_dsn, schema=pg_checkpointer.schema)
    fresh.get_thread("t")  # a new checkpointer in this process still probes first
    assert calls == ["probe"]
    fresh.close()


def test_the_state_read_with_the_lock_is_used_once_and_never_after_a_write(pg_checkpointer: PgCheckpointer) -> None:
    """The run lock reads the thread's state in its own round trip; the run's first read takes it, and a write by
    this checkpointer makes it stale, so a later read goes to PostgreSQL."""
    cp = pg_checkpointer
    cp.put_thread("t", {"n": 1}, expected_version=0)

    async def body() -> None:
        async with cp.arun_lock("t"):
            first = await cp.aget_thread("t")  # the read made with the lock
            assert first is not None and first.values == {"n": 1}
            await cp.aput_thread("t", {"n": 2}, expected_version=1)
            again = await cp.aget_thread("t")
            assert again is not None and (again.version, again.values) == (2, {"n": 2})
        async with cp.arun_lock("t"):
            await cp.aput_thread("t", {"n": 3}, expected_version=2)  # written before the first read
            latest = await cp.aget_thread("t")
            assert latest is not None and latest.values == {"n": 3}
        async with cp.arun_lock("new thread"):
            assert await cp.aget_thread("new thread") is None

    run_sync(body())


def test_a_new_threads_start_goes_with_the_lock_only_under_the_runs_own_lease(
    pg_checkpointer: PgCheckpointer, pg_dsn: str, pg_schema: str
) -> None:
    """The start sent with the lock is written when this run claimed the lease and no thread exists, and answers
    the run's first write (the same one) without a statement of its own; a run refused the lock writes nothing
    (without the lease condition it would create the thread another run holds); on a thread that exists it writes
    nothing and the run's write goes through as usual; any other first write is refused, never taken as the start."""
    cp = pg_checkpointer
    hello = Message.user("hello", message_id="m1")
    other = PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema)

    async def body() -> None:
        async with hold_run_lock(cp, "new", None, start=({"n": 1}, [hello])):
            assert await cp.aget_thread("new") is None  # read before the start, in the same round trip
            assert [m.message_id for m in await other.alist_messages("new")] == ["m1"]  # committed with the lock
            assert await cp.aput_thread("new", {"n": 1}, expected_version=0, new_messages=[hello]) == 1
            assert await cp.aput_thread("new", {"n": 2}, expected_version=1) == 2  # (the next one is written)
        async with hold_run_lock(cp, "held", None):  # another run holds a thread that does not exist yet
            with pytest.raises(ThreadBusyError):
                async with hold_run_lock(other, "held", None, start=({"n": 1}, [hello])):
                    pass
            assert await cp.aget_thread("held") is None and await cp.alist_messages("held") == []
        async with hold_run_lock(cp, "new", None, start=({"n": 9}, [Message.user("again", message_id="m2")])):
            snap = await cp.aget_thread("new")
            assert snap is not None and (snap.version, snap.values) == (2, {"n": 2})  # untouched
            assert await cp.aput_thread("new", {"n": 3}, expected_version=2) == 3
        async with hold_run_lock(cp, "third", None, start=({"n": 1}, [])):
            with pytest.raises(AssertionError, match="not the start sent with its lock"):
                await cp.aput_thread("third", {"n": 5}, expected_version=0)

    try:
        run_sync(body())
    finally:
        other.close()
    assert [m.message_id for m in cp.list_messages("new")] == ["m1"]


def _lock_is_free(dsn: str, key: int) -> bool:
    """Asked from a connection of the test's own: can the advisory lock be taken now? (Released again at once.)"""
    with psycopg.connect(dsn, autocommit=True) as conn:
        got = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        if got and got[0]:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
            return True
        return False


def test_the_unlock_travels_with_the_last_write_and_only_when_that_write_happens(
    pg_checkpointer: PgCheckpointer, pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """After the hinted write the lock is free before the run lock's block even ends (one round trip for both);
    a hinted write that never reaches PostgreSQL leaves the lock held until the block ends, as without the hint."""
    cp = pg_checkpointer
    key = cp.run_lock_key("t")

    async def body() -> None:
        async with cp.arun_lock("t"):
            cp.release_lock_with_next_write("t")
            assert not _lock_is_free(pg_dsn, key)  # a hint releases nothing by itself
            await cp.aput_thread("t", {"n": 1}, expected_version=0)
            assert _lock_is_free(pg_dsn, key)  # released behind the write, inside the block
        async with cp.arun_lock("t"):
            cp.release_lock_with_next_write("t")
            with pytest.raises(Exception, match="state of thread"):
                await cp.aput_thread("t", {"n": object()}, expected_version=1)  # refused before any statement
            assert not _lock_is_free(pg_dsn, key)
        assert _lock_is_free(pg_dsn, key)  # the block's own unlock
        async with cp.arun_lock("t"):
            assert (await cp.aget_thread("t")).version == 1  # type: ignore[union-attr]

    with caplog.at_level(logging.WARNING):
        run_sync(body())
    assert [r for r in caplog.records if "releasing the run lock" in r.getMessage()] == []


def test_a_run_holds_its_lock_to_its_last_write_even_when_a_resume_comes_first(
    pg_checkpointer: PgCheckpointer, pg_dsn: str
) -> None:
    """Resume + new input in one invoke: the resumed walk's END write is not the run's last, so the lock stays
    held for the new input's walk; it is free once invoke returns."""
    cp = pg_checkpointer
    key = cp.run_lock_key("t")
    script = [Reply(tool_calls=[("refund_order", {"order_id": "1"})]), "refunded", "anything else?"]

    def refund_order(order_id: str) -> str:
        """Refund an order."""
        return f"refunded {order_id}"

    def app() -> Any:
        return ReactAgent(ScriptedModel(script), tools=[refund_order]).compile(cp)

    with crashpoints.armed("tool.after_record"), pytest.raises(CrashInjected):
        app().invoke({"messages": ["refund order 1"]}, {"thread_id": "t"})
    held: list[bool] = []
    with crashpoints.armed("run.before_node", 3, lambda name, n: held.append(not _lock_is_free(pg_dsn, key))):
        result = app().invoke({"messages": ["thanks"]}, {"thread_id": "t"})  # resume (2 nodes), then the new input
    assert held == [True]
    assert result.final_text and [m.role for m in result.messages][-2:] == ["user", "assistant"]
    assert _lock_is_free(pg_dsn, key)


def _waiter_sees(dsn: str, schema: str, thread: str, key: int, seen: list[int]) -> None:
    """Wait for the advisory lock and read the thread's version at once, in the same pipeline (microseconds)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.pipeline():
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))
            cur = conn.execute(
                sql.SQL("SELECT version FROM {}.threads WHERE thread_id = %s").format(sql.Identifier(schema)), (thread,)
            )
        seen.append(cur.fetchone()[0])  # type: ignore[index]
        conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


def _lock_is_awaited(dsn: str, key: int) -> bool:
    """Is some session waiting for advisory lock *key* (a 64-bit key is split into classid/objid)?"""
    high, low = (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid::bigint = %s "
            "AND objid::bigint = %s",
            (high, low),
        ).fetchone()
    return bool(row and row[0])


def test_a_run_waiting_for_the_lock_sees_the_last_write_the_moment_it_gets_the_lock(
    pg_checkpointer: PgCheckpointer, pg_dsn: str
) -> None:
    """The unlock behind the last write must run after that write commits: a waiter that gets the lock and reads
    at once must see the write. An unlock sent in the write's own implicit transaction (a pipeline's statements
    share one until its sync) freed the lock before the commit: this test saw the old state in 25 and 48 of 60
    trials (two runs), the 8-resumer test once in 200."""
    cp = pg_checkpointer
    stale: list[int] = []
    for trial in range(60):
        thread = f"w{trial}"
        key = cp.run_lock_key(thread)
        cp.put_thread(thread, {"n": 0}, expected_version=0)
        seen: list[int] = []
        worker = threading.Thread(target=_waiter_sees, args=(pg_dsn, cp.schema, thread, key, seen))

        async def last_write(thread: str = thread, key: int = key, worker: threading.Thread = worker) -> None:
            async with cp.arun_lock(thread):
                worker.start()
                for _ in range(1000):  # until the waiter's request is queued behind our lock (bounded)
                    if await asyncio.to_thread(_lock_is_awaited, pg_dsn, key):
                        break
                cp.release_lock_with_next_write(thread)
                await cp.aput_thread(thread, {"n": 1}, expected_version=1)
            await asyncio.to_thread(worker.join, 10)

        run_sync(last_write())
        if seen != [2]:
            stale.append(trial)
    assert stale == []


def test_readers_of_a_thread_this_process_is_running_share_its_lock_connection_safely(
    pg_checkpointer: PgCheckpointer, caplog: pytest.LogCaptureFixture
) -> None:
    """A server's state endpoint reads a thread while a run (a request, or recovery) in the same process holds its
    lock: the reads go through the lock's connection, one statement at a time, never into the run's pipeline.
    Without the guard nearly every one of these runs broke its connection ("another command is already in
    progress") and a reader failed."""
    cp = pg_checkpointer
    from benchmarks.scenario import tenxgraph_app, tenxgraph_input

    app = tenxgraph_app(cp)
    errors: list[str] = []

    async def trials() -> None:
        for trial in range(30):
            thread, done = f"r{trial}", asyncio.Event()

            async def reader(thread: str = thread, done: asyncio.Event = done) -> None:
                while not done.is_set():
                    try:
                        await cp.aget_thread(thread)
                        await cp.alist_messages(thread)
                    except Exception as exc:
                        errors.append(f"reader: {type(exc).__name__}: {exc}")
                    await asyncio.sleep(0)

            readers = [asyncio.ensure_future(reader()) for _ in range(3)]
            try:
                result = await app.ainvoke(tenxgraph_input(), {"thread_id": thread})
                assert result.status == "done"
            finally:
                done.set()
                await asyncio.gather(*readers)

    with caplog.at_level(logging.WARNING):
        run_sync(trials())
    assert errors == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


@pytest.mark.parametrize("blip", ["terminated", "outage 0.3 s"])
def test_a_blip_of_the_lock_connection_does_not_run_an_in_flight_sibling_twice(
    pg_dsn: str, pg_schema: str, blip: str
) -> None:
    """#26's scenario: a refund and a slower email run in parallel; right after the refund's effect the run's lock
    connection is terminated, or PostgreSQL is unreachable for 0.3 s (through a proxy of the test's own), and a
    second run (a client retry, another server's recovery) arrives 0.8 s later, while the email is still being
    sent. Before the lease it took the thread and sent the email again; now it is refused, and the first run takes
    its lock again and finishes: the email is sent once."""
    from pytest_replaysafe.run.faults import Proxy, proxied_dsn

    proxies: dict[tuple[str, int], Proxy] = {}
    dsn = proxied_dsn(pg_dsn, proxies) if blip.startswith("outage") else pg_dsn
    cp = PgCheckpointer(postgres_dsn=dsn, schema=pg_schema)
    sent: list[str] = []
    second: list[str] = []

    def second_run() -> None:
        _resume_from_another_worker(dsn, pg_schema, agent, {"thread_id": "blip", "lock_timeout": 0}, second)

    later = threading.Timer(0.8, second_run)

    async def refund_order(order_id: str) -> str:
        """Refund an order (then the database drops this run's lock connection, or cannot be reached a while)."""
        if proxies:
            next(iter(proxies.values())).cut(0.3)
        else:
            with psycopg.connect(pg_dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (_lock_holder_pid(cp, pg_dsn, "blip"),))
        later.start()
        return f"refunded {order_id}"

    async def send_email(to: str) -> str:
        """Send an email (slower: still in flight when the second run arrives)."""
        sent.append(to)
        await asyncio.sleep(1.5)
        return "sent"

    def agent(checkpointer: PgCheckpointer) -> Any:
        model = ScriptedModel(
            [Reply(tool_calls=[("refund_order", {"order_id": "1042"}), ("send_email", {"to": "ada"})]), "Done."]
        )
        return ReactAgent(model, tools=[refund_order, send_email]).compile(checkpointer)

    try:
        result = agent(cp).invoke(MSG, {"thread_id": "blip"})
        later.join()
        assert sent == ["ada"], f"the email was sent {len(sent)} times (second run: {second})"
        assert second == ["refused"] and result.final_text == "Done."  # the first run kept its thread
    finally:
        cp.close()
        for proxy in proxies.values():
            proxy.close()


def test_a_resumes_decisions_are_read_with_the_lock_and_answer_only_the_first_ledger_read(
    pg_checkpointer: PgCheckpointer, pg_dsn: str, pg_schema: str
) -> None:
    """The keys hinted before the lock are read behind it (as the lock found them) and answer the thread's first
    ledger read when it asks for no other key; any other read, a second one, or a read after a ledger write goes
    to PostgreSQL (a record another writer added after the lock's read is seen there, never hidden)."""
    cp = pg_checkpointer
    other = PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema)
    yes = {"kind": "decision", "value": True}

    async def body() -> None:
        await cp.aput_tool_result("t", "decision:a", yes)
        async with hold_run_lock(cp, "t", None, ledger_keys=["decision:a", "decision:b"]):
            await other.aput_tool_result("t", "decision:b", yes)  # (a writer that ignores the lock, after its read)
            assert await cp.aget_tool_results("t", ["decision:b", "decision:a"]) == {"decision:a": yes}  # the lock's
            assert await cp.aget_tool_results("t", ["decision:b"]) == {"decision:b": yes}  # read again: once only
        async with hold_run_lock(cp, "t", None, ledger_keys=["decision:a"]):
            both = {"decision:a": yes, "decision:b": yes}
            assert await cp.aget_tool_results("t", ["decision:a", "decision:b"]) == both  # not all of them hinted
        async with hold_run_lock(cp, "t", None, ledger_keys=["decision:d"]):
            await cp.aput_tool_result("t", "decision:c", yes)  # a ledger write of the thread: the lock's read is old
            await other.aput_tool_result("t", "decision:d", yes)
            assert await cp.aget_tool_results("t", ["decision:d"]) == {"decision:d": yes}  # read after the write

    try:
        run_sync(body())
    finally:
        other.close()
