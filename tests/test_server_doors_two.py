"""The server's doors, round two (#49): each test sends the request that got through before its fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tenxgraph import Reply, ScriptedModel
from tenxgraph.prebuilt import ReactAgent
from tenxgraph.server.doors import parse_tokens
from tenxgraph.server.limits import Limits
from tenxgraph.storage.checkpointer import SqliteCheckpointer

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from tenxgraph.server import create_app

LOCAL = "http://127.0.0.1"
RUN = {"messages": [{"role": "user", "text": "refund order 1042", "message_id": "req-1"}]}
SECRET = "postgres://admin:hunter2@db.internal:5432/prod"


def client(app: Any, **headers: str) -> TestClient:
    return TestClient(app, base_url=LOCAL, headers=headers)


def failing_graph(db: Path, exc: Exception) -> Any:
    def lookup(order_id: str) -> str:
        """Look an order up."""
        raise AssertionError("never called")

    class Failing(ScriptedModel):
        async def agenerate(self, *args: Any, **kwargs: Any) -> Any:
            raise exc

    return ReactAgent(Failing(["x"]), tools=[lookup]).compile(SqliteCheckpointer(db))


# -- 1, 2: secrets and errors -------------------------------------------------------------------------------------
@pytest.mark.parametrize("exc", [RuntimeError(f"cannot reach {SECRET}"), ValueError(f"bad DSN {SECRET}")])
def test_a_failed_run_shows_its_client_an_error_id_in_the_answer_and_the_state(
    tmp_path: Path, exc: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    with client(create_app(failing_graph(tmp_path / "a.db", exc), recovery=False)) as c, caplog.at_level("ERROR"):
        answer = c.post("/threads/t/runs", json=RUN)
        state = c.get("/threads/t/state")
    assert answer.status_code == 500, answer.text  # (a node's ValueError is the run's failure, not a bad request)
    error_id = answer.json()["error_id"]
    meta = state.json()["values"]["meta"]
    assert state.status_code == 200 and meta["status"] == "error" and meta["error_id"] == error_id
    assert error_id in meta["error"]
    for text in (answer.text, state.text):
        assert "hunter2" not in text and "db.internal" not in text and type(exc).__name__ not in text
    logged = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert error_id in logged and "hunter2" in logged  # the operator's log keeps the cause under the id


# -- 3: run limits a client cannot lift ------------------------------------------------------------------------------
def test_a_run_that_omits_recursion_limit_gets_the_operators_ceiling(tmp_path: Path) -> None:
    runs: list[str] = []

    def refund_order(order_id: str) -> str:
        """Refund an order."""
        runs.append(order_id)
        return "refunded"

    model = ScriptedModel([Reply(tool_calls=[("refund_order", {"order_id": str(i)})]) for i in range(30)])
    graph = ReactAgent(model, tools=[refund_order]).compile(SqliteCheckpointer(tmp_path / "a.db"))
    with client(create_app(graph, recovery=False, limits=Limits(recursion_limit=4))) as c:
        answer = c.post("/threads/t/runs", json=RUN)
    assert answer.status_code == 500 and len(runs) <= 2, (answer.text, runs)  # 4 nodes: 2 model turns, 2 tools


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"tool_timeout": 1e-300}, "below this server's floor of 0.1 s"),
        ({"node_timeout": 0.001}, "below this server's floor"),
        ({"recursion_limit": 2.5}, "whole number"),
        ({"tracer_provider": "x"}, "'tracer_provider'"),
        ({"thread_id": "other"}, "'thread_id'"),
    ],
)
def test_a_clients_config_gets_a_floor_and_only_the_limits(tmp_path: Path, config: dict[str, Any], says: str) -> None:
    runs: list[str] = []

    def refund_order(order_id: str) -> str:
        """Refund an order."""
        runs.append(order_id)
        return "refunded"

    model = ScriptedModel([Reply(tool_calls=[("refund_order", {"order_id": "1"})]), "done"])
    graph = ReactAgent(model, tools=[refund_order]).compile(SqliteCheckpointer(tmp_path / "a.db"))
    with client(create_app(graph, recovery=False)) as c:
        answer = c.post("/threads/t/runs", json={**RUN, "config": config})
        assert answer.status_code == 422 and says in answer.json()["error"], answer.text
        assert c.get("/threads/t/state").status_code == 404 and runs == []  # nothing ran


# -- 9: the id limit is the stored id's -------------------------------------------------------------------------------
def test_a_thread_id_whose_owner_prefix_takes_it_past_the_limit_is_a_422(tmp_path: Path) -> None:
    graph = ReactAgent(ScriptedModel(["hi"] * 3), tools=[]).compile(SqliteCheckpointer(tmp_path / "a.db"))
    app = create_app(graph, tokens=parse_tokens("alice=ta", "OWNERS"), recovery=False)
    with client(app, authorization="Bearer ta") as alice:
        long_id = "x" * 510  # within 512 bytes; "alice/" makes it 516
        for response in (alice.post(f"/threads/{long_id}/runs", json=RUN), alice.get(f"/threads/{long_id}/state")):
            assert response.status_code == 422 and "at most 506 bytes" in response.json()["error"], response.text
        assert alice.post(f"/threads/{'x' * 506}/runs", json=RUN).status_code == 200


# -- 12: one decision per key -----------------------------------------------------------------------------------------
def test_a_resume_that_names_an_interrupt_twice_is_a_422(tmp_path: Path) -> None:
    graph = ReactAgent(ScriptedModel(["hi"]), tools=[]).compile(SqliteCheckpointer(tmp_path / "a.db"))
    body = '{"resume": {"intr_1": false, "intr_1": true}}'
    with client(create_app(graph, recovery=False)) as c:
        answer = c.post("/threads/t/runs", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 422 and "'intr_1' twice" in answer.json()["error"], answer.text
