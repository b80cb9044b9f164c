"""Storage faults as a dimension (``--crash-faults``): PostgreSQL connections really terminated at each point
(``drop``), and the cache faults turned off and on; each with a broken runtime only that fault shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pytest_replaysafe.matrix import services
from pytest_replaysafe.run import faults

ROOT = Path(__file__).resolve().parents[1]
REFUND = ROOT / "examples/support_refund/test_support_refund.py"
PARALLEL = ROOT / "examples/parallel_tools/test_parallel_tools.py"


def matrix(folder: Path, mutant: str | None, backend: str, *args: str, example: Path = REFUND) -> dict[str, Any]:
    folder.mkdir()
    (folder / "conftest.py").write_text(f"from tests.mutants import apply\n\napply({mutant!r})\n")
    (folder / "test_r.py").write_text(example.read_text())
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", "no:xdist", "--crash-matrix"]
    command += [f"--crash-backends={backend}", "--crash-seed=3", "--crash-report=r.json", *args, "test_r.py"]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert (folder / "r.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    data: dict[str, Any] = json.loads((folder / "r.json").read_text())
    data["stdout"] = done.stdout
    return data


def failing(data: dict[str, Any]) -> int:
    return sum(
        n for o, n in data["summary"].items() if o in ("violation", "resume_failed", "error", "failed", "vacuous")
    )


def test_fault_names_parse_and_bad_ones_are_usage_errors() -> None:
    assert faults.parse(None) == {"cache"} and faults.parse("") == {"cache"}
    assert faults.parse("all") == set(faults.FAULTS) and faults.parse("none") == frozenset()
    assert faults.parse("drop, CACHE") == {"cache", "drop"}
    with pytest.raises(
        pytest.UsageError, match=r"unknown fault.*'partition'.*cache, drop, outage, redis-down, readonly"
    ):
        faults.parse("drop,partition")


def test_only_this_process_connections_are_found(pg_dsn: str) -> None:
    """The drop fault must never terminate what it does not own (another xdist worker, a user's session)."""
    port = faults._port_of(pg_dsn)
    before = set(faults.client_ports(port))
    with psycopg.connect(pg_dsn) as conn:
        pid = conn.info.backend_pid
        mine = set(faults.client_ports(port)) - before
        assert len(mine) == 1
        with psycopg.connect(pg_dsn, autocommit=True) as other:
            row = other.execute("SELECT client_port FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        assert row is not None and row[0] in mine
    assert set(faults.client_ports(port)) == before
    assert faults._port_of("host=127.0.0.1 port=6543 dbname=x") == 6543


@pytest.mark.xdist_group("pg-drop")
def test_dropped_connections_never_make_a_call_run_twice(tmp_path: Path, pg_dsn: str) -> None:
    os.environ.setdefault(services.ENV_PG, pg_dsn)
    data = matrix(tmp_path / "drop", None, "postgres", "--crash-faults=drop", "--crash-modes=drop")
    cells = data["cells"]
    assert cells and {c["mode"] for c in cells} == {"drop"} and failing(data) == 0
    assert {c["outcome"] for c in cells} == {"protected"}  # no crash gap applies to a drop
    notes = [e["text"] for c in cells for e in c["timeline"] if e["kind"] == "fault"]
    assert len(notes) == len(cells) and all("terminated (pg_terminate_backend)" in n for n in notes)
    # its lease kept the thread: the run took its lock again on a new connection and finished, and a second worker
    # arriving during the fault (and, with a call in flight, after the lease would have run out) was refused
    assert all("the run went on and finished" in n for n in notes)
    # (at the last advance the run has released the thread with its last write: no second worker comes)
    assert sum("a second worker arriving during the fault: refused" in n for n in notes) >= len(notes) - 2
    assert any("later: refused" in n for n in notes) and not any(": finished" in n for n in notes)
    assert "drop PostgreSQL connections terminated" in data["stdout"]  # the grid's legend names the column
    assert all(c["repro"].endswith(f"--crash-faults=drop --crash-hits={c['hit']}") for c in cells)


@pytest.mark.xdist_group("pg-drop")
def test_a_second_worker_during_a_drop_never_runs_an_in_flight_sibling_again(tmp_path: Path, pg_dsn: str) -> None:
    """#26 in the matrix: parallel calls (examples/parallel_tools), the lock connection dropped while a sibling is
    in flight, a second worker arriving during the drop and again after the lease would have run out: it is
    refused every time, and nothing runs twice (tests/mutants.py lease_ignored and lease_not_renewed are caught
    by these cells)."""
    os.environ.setdefault(services.ENV_PG, pg_dsn)
    folder = tmp_path / "parallel"
    data = matrix(folder, None, "postgres", "--crash-faults=drop", "--crash-modes=drop", example=PARALLEL)
    cells = data["cells"]
    assert cells and failing(data) == 0 and {c["outcome"] for c in cells} == {"protected"}
    in_flight = [c for c in cells if c["point"] in ("tool.in_flight", "tool.after_return")]
    notes = [e["text"] for c in in_flight for e in c["timeline"] if e["kind"] == "fault"]
    assert len(notes) >= 4 and all("fault: refused; again 1.8 s later: refused" in n for n in notes)


@pytest.mark.xdist_group("pg-drop")
def test_a_pool_that_keeps_dead_connections_is_caught_only_by_the_drop_fault(tmp_path: Path, pg_dsn: str) -> None:
    """tests/mutants.py dead_connections_reused is PgCheckpointer before this fault found it: after the server
    dropped its connections, runs and resumes failed on the dead ones left in the pool."""
    os.environ.setdefault(services.ENV_PG, pg_dsn)
    assert failing(matrix(tmp_path / "plain", "dead_connections_reused", "postgres")) == 0
    # (the drop cells only: after one, the mutant's pool keeps dead connections for every later cell of the worker,
    # the budgeted contests and recovery included, so in a default run those fail too, in an order xdist decides)
    caught = matrix(
        tmp_path / "drop", "dead_connections_reused", "postgres", "--crash-faults=drop", "--crash-modes=drop"
    )
    assert caught["summary"]["resume_failed"] > 0  # the resumes fail on the dead connections
    assert {c["mode"] for c in caught["cells"]} == {"drop"}


def test_a_trusted_cache_is_caught_only_when_the_cache_faults_run(tmp_path: Path, pg_dsn: str, redis_url: str) -> None:
    os.environ.setdefault(services.ENV_PG, pg_dsn)
    os.environ.setdefault(services.ENV_REDIS, redis_url)
    quiet = matrix(
        tmp_path / "none", "stale_redis_trusted", "postgres+redis", "--crash-modes=inprocess", "--crash-faults=none"
    )
    assert failing(quiet) == 0 and not any(e["kind"] == "fault" for c in quiet["cells"] for e in c["timeline"])
    loud = matrix(tmp_path / "cache", "stale_redis_trusted", "postgres+redis", "--crash-modes=inprocess")
    assert loud["summary"]["violation"] > 0


def test_the_proxy_forwards_cuts_refuses_and_comes_back(redis_url: str) -> None:
    from urllib.parse import urlsplit

    import redis

    proxies: dict[tuple[str, int], faults.Proxy] = {}
    url = faults.proxied_redis_url(redis_url, proxies)
    proxy = next(iter(proxies.values()))
    assert urlsplit(url).port == proxy.port != urlsplit(redis_url).port
    try:
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        assert client.ping()
        assert proxy.cut(0.3) == 1  # the open connection is cut...
        with pytest.raises(redis.ConnectionError):
            client.ping()  # ...and a new one is refused while it is down
        time.sleep(0.35)
        assert client.ping()  # then it is back
        proxy.cut(None)
        with pytest.raises(redis.ConnectionError):
            client.ping()
        proxy.restore()
        assert client.ping()
        client.close()
    finally:
        proxy.close()
    assert proxy.port not in faults.PROXIES


def test_postgres_unreachable_for_a_while_and_redis_down_never_make_a_call_run_twice(
    tmp_path: Path, pg_dsn: str, redis_url: str
) -> None:
    os.environ.setdefault(services.ENV_PG, pg_dsn)
    os.environ.setdefault(services.ENV_REDIS, redis_url)
    args = ["--crash-faults=outage,redis-down", "--crash-modes=outage,redis-down"]
    data = matrix(tmp_path / "outage", None, "postgres+redis", *args)
    cells = data["cells"]
    assert {c["mode"] for c in cells} == {"outage", "redis-down"} and failing(data) == 0
    assert {c["outcome"] for c in cells} == {"protected"}
    notes = {c["mode"]: [e["text"] for e in c["timeline"] if e["kind"] == "fault"] for c in cells}
    assert all(n and "unreachable" in n[0] for n in notes.values())
    outage = [e["text"] for c in cells if c["mode"] == "outage" for e in c["timeline"] if e["kind"] == "fault"]
    # the lease kept the thread through the outage: the run took its lock again once PostgreSQL was back
    assert all("the run went on and finished" in n for n in outage)
    assert any("a second worker arriving during the fault: refused" in n for n in outage)
    assert "out PostgreSQL unreachable for a while" in data["stdout"] and "rdwn Redis unreachable" in data["stdout"]


INDOUBT_AGENT = '''
import pytest
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel, tool


@tool(on_in_doubt="fail")
def open_ticket(title: str) -> str:
    """Open a ticket (never twice: a call in doubt is reported, not run again)."""
    return "ticket: " + title


def lookup(order_id: str) -> str:
    """Look an order up."""
    return "order " + order_id


@pytest.mark.crash_matrix
def test_ticket(crash_run):
    model = ScriptedModel([
        Reply(tool_calls=[("lookup", {"order_id": "1042"}), ("open_ticket", {"title": "refund 1042"})]),
        "Done.",
    ])
    app = ReactAgent(model, tools=[lookup, open_ticket]).compile(checkpointer=crash_run.checkpointer)
    assert crash_run.invoke(app, {"messages": [Message.text_message("go")]}).final_text == "Done."
'''


def in_doubt_matrix(folder: Path, mutant: str | None, *args: str) -> dict[str, Any]:
    folder.mkdir()
    (folder / "conftest.py").write_text(f"from tests.mutants import apply\n\napply({mutant!r})\n")
    (folder / "test_t.py").write_text(INDOUBT_AGENT)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", "no:xdist", "--crash-matrix"]
    command += ["--crash-backends=sqlite", "--crash-seed=5", "--crash-report=r.json", *args, "test_t.py"]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert (folder / "r.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((folder / "r.json").read_text())  # type: ignore[no-any-return]


def test_sqlite_gone_read_only_reruns_only_calls_whose_record_was_refused(tmp_path: Path) -> None:
    args = ["--crash-faults=readonly", "--crash-modes=readonly"]
    data = matrix(tmp_path / "ro", None, "sqlite", *args)
    cells = data["cells"]
    assert {c["mode"] for c in cells} == {"readonly"} and failing(data) == 0
    gaps = [c for c in cells if c["outcome"] == "known_gap"]
    assert gaps and {c["gap"] for c in gaps} == {"failed_record_write"}  # no crash gap applies to a fault
    assert any(c["outcome"] == "protected" for c in cells)  # a fault before any tool ran, or after the records
    for c in gaps:
        texts = [e["text"] for e in c["timeline"]]
        assert any("ledger record write FAILED" in t for t in texts) and any("started AGAIN" in t for t in texts)
        assert all(n == 2 for n in c["executions"].values() if n > 1)  # one refused write: one more run
    # a tool with an in-doubt policy never runs without its intent, and is never silently re-run
    policed = in_doubt_matrix(tmp_path / "policy", None, *args)
    assert failing(policed) == 0
    assert not [c for c in policed["cells"] if "open_ticket" in c["detail"] and c["outcome"] == "known_gap"]
    assert any(c["outcome"] == "in_doubt_handled" for c in policed["cells"])  # its record was refused
    notes = [e["text"] for c in policed["cells"] for e in c["timeline"] if e["kind"] == "fault"]
    assert any("IntentWriteError: tool 'open_ticket'" in n and "was not run" in n for n in notes)


def test_a_tool_run_without_its_intent_is_caught_only_when_the_disk_goes_read_only(tmp_path: Path) -> None:
    """tests/mutants.py intent_failure_ignored is the runtime before this fault found it: a tool with an
    in-doubt policy ran although its intent could not be written, so the refused record went undetected."""
    assert failing(in_doubt_matrix(tmp_path / "plain", "intent_failure_ignored")) == 0
    caught = in_doubt_matrix(tmp_path / "ro", "intent_failure_ignored", "--crash-faults=readonly")
    found = [c for c in caught["cells"] if c["outcome"] == "violation"]
    assert found and all(c["mode"] == "readonly" and "open_ticket" in c["detail"] for c in found)


def test_a_drop_that_finds_nothing_to_drop_is_an_error_cell_never_a_pass(tmp_path: Path, pg_dsn: str) -> None:
    """Over a Unix socket there is no client port to find: the fault cannot be applied, and the cell says so."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    socket_dir = "/var/run/postgresql"
    if not os.path.isdir(socket_dir):
        pytest.skip(f"no PostgreSQL socket directory {socket_dir} on this machine")
    dsn = make_conninfo(pg_dsn, host=socket_dir, port=str(conninfo_to_dict(pg_dsn).get("port") or 5432))
    env_before = os.environ.get(services.ENV_PG)
    os.environ[services.ENV_PG] = dsn
    try:
        data = matrix(tmp_path / "sock", None, "postgres", "--crash-faults=drop", "--crash-modes=drop")
    finally:
        if env_before is None:
            os.environ.pop(services.ENV_PG, None)
        else:
            os.environ[services.ENV_PG] = env_before
    cells = data["cells"]
    assert cells and {c["outcome"] for c in cells} == {"error"}
    assert all("found no TCP connection of this process to PostgreSQL" in c["detail"] for c in cells)
