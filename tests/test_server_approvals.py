"""Approvals over HTTP: a paused thread in ``GET /threads/{id}/state``, ``POST /runs`` with ``resume``, a real
server killed between the pause and the approval and during the approved run, double clicks, metrics."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tenxgraph.core import crashpoints
from tests.test_server import ROOT, free_port, start_server

ASK = {"messages": [{"role": "user", "text": "refund orders 1042 and 1043", "message_id": "req-1"}]}


def call(port: int, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any] | str]:
    data = json.dumps(body).encode() if body is not None else None
    method = "POST" if body is not None else "GET"
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as exc:
        text, status = exc.read().decode(), exc.code
    return status, (json.loads(text) if text.startswith("{") else text)


def server_env(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    if backend == "sqlite":
        target = str(tmp_path / "server.db")
    else:
        target = f"{request.getfixturevalue('pg_dsn')}#{request.getfixturevalue('pg_schema')}"
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TENX_APP": "approved_refund",
        "TENX_BACKEND": backend,
        "TENX_TARGET": target,
        "TENX_EFFECTS": str(tmp_path / "effects.log"),
        crashpoints.ENV_MARKER: str(tmp_path / "marker.json"),
    }


def metric(port: int, name: str) -> float:
    status, text = call(port, "/metrics")
    assert status == 200 and isinstance(text, str)
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name)))


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_server_restarted_between_pause_and_approval_refunds_once(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env, port = server_env(backend, tmp_path, request), free_port()
    effects = tmp_path / "effects.log"
    first = start_server(port, env)
    try:
        status, paused = call(port, "/threads/ticket-1/runs", ASK)
        assert status == 200 and isinstance(paused, dict) and paused["status"] == "interrupted"
        (waits,) = paused["interrupts"]
        assert (waits["kind"], waits["tool"], waits["args"]) == (
            "approval", "refund_order", {"order_id": "1042", "amount": 250.0}
        )  # fmt: skip
        assert not effects.exists()  # nothing of the batch ran
    finally:
        first.kill()  # kill -9 while the thread waits for a person
        first.wait(timeout=30)
    # the restarted server finds the pause where it was (its recovery left the waiting thread alone)
    doomed = start_server(port, {**env, crashpoints.ENV_CRASH_AT: "approval.after_decision:1:kill",
                                 crashpoints.ENV_CRASH_TEST: "1"})  # fmt: skip
    status, state = call(port, "/threads/ticket-1/state")
    assert status == 200 and isinstance(state, dict) and state["status"] == "interrupted"
    assert state["interrupts"] == [waits] and metric(port, "tenxgraph_threads_waiting") == 1
    resume = {"resume": {waits["id"]: True}}
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        call(port, "/threads/ticket-1/runs", resume)  # killed right after recording the approval
    assert doomed.wait(timeout=30) == -9
    assert crashpoints.read_marker(tmp_path / "marker.json") == ("approval.after_decision", 1)
    assert not effects.exists()
    restarted = start_server(port, env)
    try:
        status, done = call(port, "/threads/ticket-1/runs", resume)  # the client retries its request
        assert status == 200 and isinstance(done, dict) and done["status"] == "done" and done["interrupts"] == []
        assert sorted(effects.read_text().splitlines()) == ["1042 250.0", "1043 30.0"]
        status, again = call(port, "/threads/ticket-1/runs", resume)  # a double click
        assert status == 200 and isinstance(again, dict) and again["version"] == done["version"]
        status, refused = call(port, "/threads/ticket-1/runs", {"resume": {waits["id"]: False}})
        assert status == 409 and isinstance(refused, dict) and refused["decided"] is True
        assert "already decided" in refused["error"]
        assert sorted(effects.read_text().splitlines()) == ["1042 250.0", "1043 30.0"]  # each refund once
        assert metric(port, "tenxgraph_interrupts_total ") == 0  # (per process: the killed server recorded it)
        assert metric(port, "tenxgraph_threads_waiting") == 0
    finally:
        restarted.terminate()
        restarted.wait(timeout=30)


def test_a_run_request_with_resume_is_checked(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from examples.approved_refund.agent import build_agent
    from examples.payments import LocalProvider
    from tenxgraph.server import create_app
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    payments = LocalProvider()
    app = create_app(build_agent(SqliteCheckpointer(tmp_path / "db.sqlite"), payments))
    with TestClient(app, base_url="http://127.0.0.1") as client:  # (with: the metrics are on)
        paused = client.post("/threads/t/runs", json=ASK).json()
        waits = paused["interrupts"][0]["id"]
        both = client.post("/threads/t/runs", json={**ASK, "resume": {waits: True}})
        assert both.status_code == 422 and "send messages or resume, not both" in both.json()["error"]
        empty = client.post("/threads/t/runs", json={"resume": {}})
        assert empty.status_code == 422 and "Resume takes a non-empty dict" in empty.json()["error"]
        unknown = client.post("/threads/t/runs", json={"resume": {"approval-nope": True}})
        assert unknown.status_code == 422 and f"(pending: ['{waits}'])" in unknown.json()["error"]
        busy_input = client.post("/threads/t/runs", json={"messages": [{"role": "user", "text": "hello?"}]})
        assert busy_input.status_code == 422 and "waits for a person's answer" in busy_input.json()["error"]
        done = client.post("/threads/t/runs", json={"resume": {waits: "no receipt"}})
        assert (
            done.status_code == 200
            and done.json()["status"] == "done"
            and payments.effects == [("refund", {"order": "1043", "amount": 30.0})]
        )
        metrics = client.get("/metrics").text
        assert 'tenxgraph_interrupts_total{how="asked"} 1' in metrics
        assert 'tenxgraph_interrupts_total{how="decided"} 1' in metrics
        assert 'tenxgraph_tool_calls_total{how="rejected"} 1' in metrics
