"""Transactional tools: a tool's writes to the checkpointer's database commit with its ledger record, so its
effect happens exactly once at every crash point (a real kill -9 inside the tool included), and an exception
rolls both back. Checkpointers that cannot do it are refused when the graph is compiled."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tenxgraph import ConfigError, Message, ReactAgent, Reply, ScriptedModel, tool
from tenxgraph.core import crashpoints
from tenxgraph.core.crashpoints import CrashInjected
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer
from tenxgraph.utils.sync import run_sync

ROOT = Path(__file__).resolve().parents[1]
MSG = {"messages": [Message.text_message("queue it")]}


def make_tool(fail: bool = False) -> Any:
    @tool(effect="transactional")
    def queue_email(to: str, tx: sqlite3.Connection) -> str:
        """Queue an email."""
        tx.execute("CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY, recipient TEXT)")
        tx.execute("INSERT INTO outbox (recipient) VALUES (?)", (to,))
        if fail:
            raise RuntimeError("the template is missing")
        return f"queued for {to}"

    return queue_email


def app(cp: Any, fail: bool = False) -> Any:
    model = ScriptedModel([Reply(tool_calls=[("queue_email", {"to": "ada"})]), "Done."])
    return ReactAgent(model, tools=[make_tool(fail)]).compile(cp)


def rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        exists = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'outbox'").fetchone()
        return int(conn.execute("SELECT count(*) FROM outbox").fetchone()[0]) if exists else 0


@pytest.mark.parametrize(
    ("point", "hit", "before"),
    [("tool.after_return", 1, 0), ("tool.after_record", 1, 1), ("node.after_complete", 2, 1)],  # (2: the tool node)
)
def test_the_write_commits_once_whatever_the_crash(tmp_path: Path, point: str, hit: int, before: int) -> None:
    cp = SqliteCheckpointer(tmp_path / "db.sqlite")
    with crashpoints.armed(point, hit), pytest.raises(CrashInjected):
        app(cp).invoke(MSG, {"thread_id": "t"})
    assert rows(tmp_path / "db.sqlite") == before  # rolled back with the record, or committed with it
    result = app(cp).invoke(None, {"thread_id": "t"})
    assert result.final_text == "Done." and rows(tmp_path / "db.sqlite") == 1
    assert result.messages[2].tool_results[0].output == "queued for ada"
    cp.close()


def test_an_exception_rolls_the_write_back_and_is_recorded(tmp_path: Path) -> None:
    cp = SqliteCheckpointer(tmp_path / "db.sqlite")
    result = app(cp, fail=True).invoke(MSG, {"thread_id": "t"})
    answer = result.messages[2].tool_results[0]
    assert answer.is_error and "the template is missing" in str(answer.output)
    assert rows(tmp_path / "db.sqlite") == 0  # the insert went with the exception
    assert app(cp, fail=True).invoke(None, {"thread_id": "t"}).messages[2].tool_results[0].is_error  # recorded
    cp.close()


CHILD = """
import os, signal, sys
sys.path.insert(0, {root!r})
from tests.test_transactional import app
from tenxgraph.core import crashpoints
from tenxgraph.storage.checkpointer import SqliteCheckpointer

cp = SqliteCheckpointer({db!r})
# the row is written (not committed) when the body returns: kill -9 right there, inside the transaction
crashpoints.arm("tool.after_return", 1, lambda name, n: os.kill(os.getpid(), signal.SIGKILL))
app(cp).invoke({{"messages": ["queue it"]}}, {{"thread_id": "t"}})
"""


def test_a_kill_9_inside_the_tool_after_its_write_leaves_the_row_once_after_the_resume(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    child = subprocess.run(
        [sys.executable, "-c", CHILD.format(root=str(ROOT), db=str(db))], capture_output=True, timeout=60
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
    assert rows(db) == 0  # the killed process's transaction did not commit
    cp = SqliteCheckpointer(db)
    result = app(cp).invoke(None, {"thread_id": "t", "lock_timeout": 10})
    assert result.final_text == "Done." and rows(db) == 1
    records = cp.list_tool_results("t")
    assert [json.loads(json.dumps(r))["output"] for r in records.values()] == ["queued for ada"]
    cp.close()


def test_checkpointers_that_cannot_join_the_transaction_are_refused_when_compiling(tmp_path: Path, pg_dsn: str) -> None:
    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

    with pytest.raises(ConfigError, match=r"tool 'queue_email' is transactional .* InMemoryCheckpointer cannot"):
        app(InMemoryCheckpointer())
    pg = PgCheckpointer(postgres_dsn=pg_dsn)
    with pytest.raises(ConfigError, match=r"over PgCheckpointer: make it an async def getting a psycopg"):
        app(pg)  # a plain function over PostgreSQL
    sqlite = SqliteCheckpointer(tmp_path / "db.sqlite")
    with pytest.raises(ConfigError, match=r"over SqliteCheckpointer: make it a plain function getting a sqlite3"):
        pg_app(sqlite)
    pg.close()
    sqlite.close()


def test_a_transactional_tool_must_take_tx() -> None:
    def no_tx(to: str) -> str:
        """Queue."""
        return to

    with pytest.raises(TypeError, match=r"declare a parameter tx \(the database connection inside it\)"):
        tool(effect="transactional")(no_tx)
    with pytest.raises(ValueError, match="nothing to be in doubt about"):
        tool(effect="transactional", on_in_doubt="fail")(no_tx)
    assert tool(effect="transactional")(make_tool().fn).policy is None  # no intent: never in doubt


def test_a_call_recorded_by_another_run_does_not_write_again(tmp_path: Path) -> None:
    """The transaction reads the ledger itself: if another run recorded the call meanwhile (a failed ledger read
    before it, a run that took the thread over), the tool does not run and its record is the answer."""
    cp = SqliteCheckpointer(tmp_path / "db.sqlite")
    first = app(cp).invoke(MSG, {"thread_id": "t"})
    key = next(iter(cp.list_tool_results("t")))
    ran: list[int] = []
    stored, wrote = run_sync(cp.atransact("t", key, lambda conn: ran.append(1) or {}))  # type: ignore[func-returns-value]
    assert (wrote, ran) == (False, []) and stored["output"] == first.messages[2].tool_results[0].output
    assert rows(tmp_path / "db.sqlite") == 1
    cp.close()


TX_AGENT = '''
import sqlite3
import pytest
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel, tool


@pytest.mark.crash_matrix(backends=["sqlite"], points=["tool.in_flight", "tool.after_return", "tool.after_record"])
def test_queue(crash_run, effects):
    @tool(effect="transactional")
    def queue_email(to: str, tx: sqlite3.Connection) -> str:
        """Queue an email."""
        effects.apply_in(tx, "queued", {"to": to})
        return "queued"

    model = ScriptedModel([Reply(tool_calls=[("queue_email", {"to": "ada"})]), "Done."])
    app = ReactAgent(model, tools=[queue_email]).compile(checkpointer=crash_run.checkpointer)
    assert crash_run.invoke(app, {"messages": [Message.text_message("go")]}).final_text == "Done."
'''


def tx_matrix(folder: Path, mutant: str | None) -> dict[str, Any]:
    folder.mkdir()
    (folder / "conftest.py").write_text(f"from tests.mutants import apply\n\napply({mutant!r})\n")
    (folder / "test_q.py").write_text(TX_AGENT)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", "no:xdist", "--crash-matrix"]
    command += ["--crash-seed=2", "--crash-report=r.json", "test_q.py"]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert (folder / "r.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((folder / "r.json").read_text())  # type: ignore[no-any-return]


def test_the_matrix_shows_exactly_once_and_catches_writes_that_commit_before_their_record(tmp_path: Path) -> None:
    control = tx_matrix(tmp_path / "control", None)
    outcomes = {(c["point"], c["outcome"]) for c in control["cells"]}
    assert ("tool.in_flight", "exactly_once") in outcomes and ("tool.after_return", "exactly_once") in outcomes
    assert control["summary"]["violation"] == 0 and control["summary"]["known_gap"] == 0  # no gap left there
    broken = tx_matrix(tmp_path / "early", "transactional_commits_early")
    found = [c for c in broken["cells"] if c["outcome"] == "violation"]
    assert found and all("its effect was applied 2 times" in c["detail"] for c in found)


# -- PostgreSQL: the tool is a coroutine on a pooled connection inside the transaction -----------------------
def make_pg_tool(table: str) -> Any:
    @tool(effect="transactional")
    async def queue_email(to: str, tx: Any) -> str:
        """Queue an email."""
        await tx.execute(f"INSERT INTO {table} (recipient) VALUES (%s)", (to,))
        return f"queued for {to}"

    return queue_email


def pg_app(cp: Any, table: str = "outbox") -> Any:
    model = ScriptedModel([Reply(tool_calls=[("queue_email", {"to": "ada"})]), "Done."])
    return ReactAgent(model, tools=[make_pg_tool(table)]).compile(cp)


@pytest.fixture
def pg_outbox(pg_checkpointer: Any) -> Iterator[tuple[Any, str]]:
    """The test's own checkpointer and schema, with an outbox table in it."""
    table = f"{pg_checkpointer.schema}.outbox"
    with psycopg.connect(pg_checkpointer.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {pg_checkpointer.schema}")  # (dropped with its table after)
        conn.execute(f"CREATE TABLE {table} (id serial PRIMARY KEY, recipient text)")
    yield pg_checkpointer, table


def pg_rows(cp: Any, table: str) -> int:
    with psycopg.connect(cp.postgres_dsn) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])  # type: ignore[index]


@pytest.mark.parametrize(
    ("point", "hit", "before"),
    [("tool.after_return", 1, 0), ("tool.after_record", 1, 1), ("node.after_complete", 2, 1)],
)
def test_postgres_the_write_commits_once_whatever_the_crash(
    pg_outbox: tuple[Any, str], point: str, hit: int, before: int
) -> None:
    cp, table = pg_outbox
    with crashpoints.armed(point, hit), pytest.raises(CrashInjected):
        pg_app(cp, table).invoke(MSG, {"thread_id": "t"})
    assert pg_rows(cp, table) == before
    result = pg_app(cp, table).invoke(None, {"thread_id": "t", "lock_timeout": 10})
    assert result.final_text == "Done." and pg_rows(cp, table) == 1


PG_CHILD = """
import os, signal, sys
sys.path.insert(0, {root!r})
from tests.test_transactional import pg_app
from tenxgraph.core import crashpoints
from tenxgraph.storage.checkpointer.pg import PgCheckpointer

cp = PgCheckpointer(postgres_dsn={dsn!r}, schema={schema!r})
crashpoints.arm("tool.after_return", 1, lambda name, n: os.kill(os.getpid(), signal.SIGKILL))
pg_app(cp, {table!r}).invoke({{"messages": ["queue it"]}}, {{"thread_id": "t"}})
"""


def test_postgres_a_kill_9_inside_the_tool_after_its_write_leaves_the_row_once(pg_outbox: tuple[Any, str]) -> None:
    cp, table = pg_outbox
    code = PG_CHILD.format(root=str(ROOT), dsn=cp.postgres_dsn, schema=cp.schema, table=table)
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
    assert pg_rows(cp, table) == 0  # the killed session's transaction was never committed
    result = pg_app(cp, table).invoke(None, {"thread_id": "t", "lock_timeout": 30})
    assert result.final_text == "Done." and pg_rows(cp, table) == 1


def test_a_transactional_call_costs_one_commit_like_any_recorded_call_and_a_read_none(tmp_path: Path) -> None:
    """Counted, not timed: every COMMIT SQLite runs for one run of a one-call agent, by the tool's effect class."""

    def run(kind: str | None) -> int:
        statements: list[str] = []
        cp = SqliteCheckpointer(
            tmp_path / f"{kind}.sqlite", on_connect=lambda c: c.set_trace_callback(statements.append)
        )
        if kind == "transactional":
            chosen = make_tool()
        else:

            @tool(effect=kind)
            def queue_email(to: str) -> str:
                """Queue an email."""
                return to

            chosen = queue_email
        model = ScriptedModel([Reply(tool_calls=[("queue_email", {"to": "ada"})]), "Done."])
        ReactAgent(model, tools=[chosen]).compile(cp).invoke(MSG, {"thread_id": "t"})
        cp.close()
        return sum(1 for s in statements if s.strip().upper().startswith("COMMIT"))

    ordinary, transactional, read = run(None), run("transactional"), run("read")
    assert transactional == ordinary  # its writes ride on the record's commit
    assert read == ordinary - 1  # no record, no commit


def test_postgres_a_timed_out_call_is_rolled_back_writes_and_all(pg_outbox: tuple[Any, str]) -> None:
    import asyncio

    cp, table = pg_outbox

    @tool(effect="transactional")
    async def queue_email(to: str, tx: Any) -> str:
        """Queue an email (slowly)."""
        await tx.execute(f"INSERT INTO {table} (recipient) VALUES (%s)", (to,))
        await asyncio.sleep(5)
        return "queued"

    model = ScriptedModel([Reply(tool_calls=[("queue_email", {"to": "ada"})]), "Done."])
    result = ReactAgent(model, tools=[queue_email]).compile(cp).invoke(MSG, {"thread_id": "t", "tool_timeout": 0.2})
    answer = result.messages[2].tool_results[0]
    assert answer.status == "timeout" and "ToolTimeoutError" in str(answer.output)
    assert pg_rows(cp, table) == 0  # the insert went with the timeout
    assert cp.list_tool_results("t") == {}  # and nothing was recorded: a replay runs it again


def test_postgres_a_transient_failure_of_the_transaction_is_tried_again(
    pg_outbox: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool timeout or a lost connection (found by the server chaos benchmark): the attempt rolled back, so the
    transaction is tried again instead of answering the model with an error and never making the write."""
    from tenxgraph.storage.checkpointer import pg

    cp, table = pg_outbox
    original = pg.transact
    failures = [psycopg.OperationalError("server closed the connection unexpectedly")]

    async def flaky(*args: Any) -> Any:
        if failures:
            raise failures.pop()
        return await original(*args)

    monkeypatch.setattr(pg, "transact", flaky)
    result = pg_app(cp, table).invoke(MSG, {"thread_id": "t"})
    assert result.messages[2].tool_results[0].output == "queued for ada" and not failures
    assert pg_rows(cp, table) == 1
