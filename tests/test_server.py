"""The API server: endpoints through Starlette's TestClient, and kill -9 of a real server process mid-run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from examples.payments import LocalProvider
from examples.support_refund.agent import build_support_agent
from tenxgraph.core import crashpoints
from tenxgraph.errors import ThreadBusyError
from tenxgraph.server import create_app
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tenxgraph.utils.sync import run_sync

ROOT = Path(__file__).resolve().parents[1]
LOCAL = "http://127.0.0.1"  # a loopback Host: the server answers loopback names only by default
RUN = {"messages": [{"role": "user", "text": "refund order 1042", "message_id": "req-1"}]}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "server.db"


@pytest.fixture
def client(db: Path) -> Any:
    app = create_app(build_support_agent(SqliteCheckpointer(db), LocalProvider()), token="s3cret")
    with TestClient(app, base_url=LOCAL, headers={"Authorization": "Bearer s3cret"}) as c:
        yield c


def test_run_then_state(client: Any) -> None:
    response = client.post("/threads/t1/runs", json=RUN)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["final_text"] == "Refunded 20.00 EUR on order 1042." and body["status"] == "done"
    assert body["messages"][0]["message_id"] == "req-1" and len(body["messages"]) == 6
    state = client.get("/threads/t1/state").json()
    assert state["version"] == body["version"] and state["messages"] == body["messages"]
    again = client.post("/threads/t1/runs", json=RUN)  # a retried request: the same message is not added twice
    assert again.status_code == 200 and len(again.json()["messages"]) == 6
    assert client.get("/healthz").json() == {"status": "ok"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"messages": [], "mesages": []}), "unknown fields ['mesages']"),
        (json.dumps({"messages": [{"role": "user", "txt": "hi"}]}), "messages[0] has unknown fields ['txt']"),
        (json.dumps({"messages": [{"role": "tool", "text": "hi"}]}), "messages[0].role must be 'user' or 'system'"),
        (json.dumps({"messages": "hi"}), "messages must be a list"),
        (json.dumps({"config": {"thread_id": "x"}}), "is not a client's to set"),
        (json.dumps({"config": {"node_timeout": "fast"}}), "node_timeout must be a number"),
    ],
)
def test_bad_requests_are_422_with_a_clear_body(client: Any, body: str, message: str) -> None:
    response = client.post("/threads/t1/runs", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422 and message in response.json()["error"]


def test_unknown_thread_state_is_404(client: Any) -> None:
    response = client.get("/threads/nope/state")
    assert response.status_code == 404 and "does not exist" in response.json()["error"]


def test_bearer_token_is_required(db: Path) -> None:
    app = create_app(build_support_agent(SqliteCheckpointer(db), LocalProvider()), token="s3cret")
    with TestClient(app, base_url=LOCAL) as anonymous:
        assert anonymous.post("/threads/t1/runs", json=RUN).status_code == 401
        assert anonymous.get("/threads/t1/state", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert anonymous.get("/healthz").status_code == 200


def test_a_run_in_progress_on_the_thread_is_409(client: Any, db: Path) -> None:
    lock = SqliteCheckpointer(db).arun_lock("busy")  # another worker holds the thread
    run_sync(lock.__aenter__())
    try:
        response = client.post("/threads/busy/runs", json=RUN)
    finally:
        run_sync(lock.__aexit__(None, None, None))
    assert response.status_code == 409 and "being run by another worker" in response.json()["error"]
    assert response.headers["Retry-After"] == "5"  # the server's lock timeout: when to try again
    assert client.post("/threads/busy/runs", json=RUN).status_code == 200  # free again
    text = client.get("/metrics").text
    assert 'tenxgraph_runs_total{outcome="busy"} 1' in text and 'tenxgraph_runs_total{outcome="finished"} 1' in text


def test_a_409_keeps_who_holds_the_thread_to_the_server(client: Any, db: Path) -> None:
    """A holder the storage can name (its lock file removed under it, its lease row naming this process): the
    library's ThreadBusyError says which process; the client's 409 does not (host names and pids stay inside)."""
    other = SqliteCheckpointer(db)
    lock = other.arun_lock("held")
    run_sync(lock.__aenter__())
    try:
        run_sync(other.aput_thread("held", {"n": 1}, expected_version=0))  # (writes the lease row)
        os.unlink(f"{db}.lock")
        with pytest.raises(ThreadBusyError, match=rf"pid {os.getpid()}"):
            run_sync(SqliteCheckpointer(db).arun_lock("held").__aenter__())
        response = client.post("/threads/held/runs", json=RUN)
    finally:
        run_sync(lock.__aexit__(None, None, None))
        other.close()
    assert response.status_code == 409 and "being run by another worker" in response.json()["error"]
    assert "pid" not in response.text and "host" not in response.text


def test_metrics_count_runs_tool_calls_and_replays_in_the_prometheus_format(client: Any, db: Path) -> None:
    assert client.get("/metrics", headers={"Authorization": ""}).status_code == 401  # behind the token too
    empty = client.get("/metrics")
    assert empty.status_code == 200 and empty.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "tenxgraph_run_seconds_count 0" in empty.text and "tenxgraph_tool_in_doubt_total 0" in empty.text
    assert client.post("/threads/m1/runs", json=RUN).status_code == 200
    # a thread left unfinished after its tool was recorded: the next run replays the call
    with crashpoints.armed("node.after_complete", 2), pytest.raises(crashpoints.CrashInjected):
        build_support_agent(SqliteCheckpointer(db), LocalProvider()).invoke(
            {"messages": ["refund order 1042"]}, {"thread_id": "m2"}
        )
    assert client.post("/threads/m2/runs", json={}).status_code == 200
    values: dict[str, float] = {}
    for line in client.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    assert values['tenxgraph_runs_total{outcome="finished"}'] == 2
    # per process: m1's lookup and refund, m2's lookup before the crash (the same process), m2's refund after it
    assert values['tenxgraph_tool_calls_total{how="executed"}'] == 4
    assert values['tenxgraph_tool_calls_total{how="replayed"}'] == 1  # m2: lookup, from its record
    assert values["tenxgraph_runs_resumed_total"] == 1
    assert values["tenxgraph_run_seconds_count"] == 2 and values['tenxgraph_run_seconds_bucket{le="+Inf"}'] == 2


# -- a real server process, killed mid-run -----------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(port: int, env: dict[str, str], *extra: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tenxgraph.server.cli", "serve", "tests.server_app:app", "--port", str(port), *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as response:
                if response.status == 200:
                    return proc
        except OSError:
            if proc.poll() is not None:
                raise AssertionError(f"server exited: {proc.stdout.read().decode() if proc.stdout else ''}") from None
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("server did not start within 30 s")


def post_run(port: int, thread: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/threads/{thread}/runs",
        data=json.dumps(RUN).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def server_killed_mid_run(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[int, dict[str, str]]:
    """A server on *backend* killed (kill -9) at its run's second ledger record: its port and environment (the
    refunds it makes go to ``tmp_path/effects.log``)."""
    if backend == "sqlite":
        target = str(tmp_path / "server.db")
    else:
        target = f"{request.getfixturevalue('pg_dsn')}#{request.getfixturevalue('pg_schema')}"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TENX_BACKEND": backend,
        "TENX_TARGET": target,
        "TENX_EFFECTS": str(tmp_path / "effects.log"),
        crashpoints.ENV_MARKER: str(tmp_path / "marker.json"),
    }
    port = free_port()
    doomed = start_server(
        port, {**env, crashpoints.ENV_CRASH_AT: "tool.after_record:2:kill", crashpoints.ENV_CRASH_TEST: "1"}
    )
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        post_run(port, "ticket-1042")  # the server dies mid-run: the connection drops
    assert doomed.wait(timeout=30) == -9
    return port, env


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_kill_9_server_mid_run_then_restart_finishes_with_one_refund(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    port, env = server_killed_mid_run(backend, tmp_path, request)
    effects = tmp_path / "effects.log"
    assert crashpoints.read_marker(tmp_path / "marker.json") == ("tool.after_record", 2)
    env.pop(crashpoints.ENV_CRASH_AT, None)
    restarted = start_server(port, env)
    try:
        body = post_run(port, "ticket-1042")  # the client retries the same request
    finally:
        restarted.terminate()
        restarted.wait(timeout=30)
    assert body["final_text"] == "Refunded 20.00 EUR on order 1042." and body["status"] == "done"
    # the restarted server says what it did, one JSON line per event
    assert restarted.stdout is not None
    events = [json.loads(line) for line in restarted.stdout.read().decode().splitlines() if line.startswith("{")]
    by_name = {e.get("event"): e for e in events}
    assert {"server_listen", "server_start", "request", "run_resumed", "tool_replayed", "run"} <= set(by_name)
    assert by_name["run_resumed"]["thread_id"] == "ticket-1042" and by_name["run_resumed"]["node"] == "TOOL"
    assert by_name["tool_replayed"]["tool"] == "refund_order"
    posts = [e for e in events if e.get("event") == "request" and e["method"] == "POST"]
    assert posts and posts[0]["status"] == 200 and posts[0]["thread_id"] == "ticket-1042"
    assert all(e["level"] in ("INFO", "WARNING") and "ts" in e for e in events)
    assert effects.read_text().splitlines() == ["1042 20.0"]  # refund_order ran once
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]


def sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_a_run_streams_its_steps_and_flags_replayed_results(client: Any, db: Path) -> None:
    response = client.post("/threads/s1/runs/stream", json=RUN)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = sse(response.text)
    steps = [d for e, d in events if e == "step"]
    assert [e for e, _ in events if e in ("step", "done")] == ["step"] * 5 + ["done"]  # MAIN, TOOL, MAIN, TOOL, MAIN
    assert [d["node"] for d in steps] == ["MAIN", "TOOL", "MAIN", "TOOL", "MAIN"]
    assert events[-1][1]["final_text"] == "Refunded 20.00 EUR on order 1042." and events[-1][1]["status"] == "done"
    assert not any(d["replayed"] for d in steps)
    final_id = steps[-1]["messages"][0]["message_id"]  # the model's tokens came as it answered, before its step
    tokens = [d["text"] for e, d in events if e == "token" and d["message_id"] == final_id]
    assert "".join(tokens) == "Refunded 20.00 EUR on order 1042." and len(tokens) > 1
    for index, (event, data) in enumerate(events):  # each result streamed as it was recorded, before its step
        if event == "step" and data["node"] == "TOOL":
            (result,) = data["messages"]
            streamed = [i for i, (e, d) in enumerate(events) if e == "tool_result" and d["message"] == result]
            assert len(streamed) == 1 and streamed[0] < index and events[streamed[0]][1]["replayed"] is False
    # a thread interrupted after its first tool call was recorded: streaming its resume flags the replay
    with crashpoints.armed("node.after_complete", 2), pytest.raises(crashpoints.CrashInjected):
        build_support_agent(SqliteCheckpointer(db), LocalProvider()).invoke(
            {"messages": ["refund order 1042"]}, {"thread_id": "s2"}
        )
    assert client.get("/threads/s2/runs/stream").status_code == 405  # a link cannot start work: POST only
    resumed = sse(client.post("/threads/s2/runs/stream", json={}).text)
    assert resumed[0][0] == "tool_result" and resumed[0][1]["replayed"] is True  # from the ledger, as it was read
    assert resumed[1][0] == "step" and resumed[1][1]["node"] == "TOOL" and resumed[1][1]["replayed"] is True
    assert resumed[-1][0] == "done"


def test_a_streamed_run_on_a_busy_thread_ends_with_an_error_event(client: Any, db: Path) -> None:
    lock = SqliteCheckpointer(db).arun_lock("busy")
    run_sync(lock.__aenter__())
    try:
        events = sse(client.post("/threads/busy/runs/stream", json={**RUN, "config": {"lock_timeout": 0}}).text)
    finally:
        run_sync(lock.__aexit__(None, None, None))
    assert events == [("error", {"status": 409, "error": events[0][1]["error"], "thread_id": "busy"})]
    assert "being run by another worker" in events[0][1]["error"]
