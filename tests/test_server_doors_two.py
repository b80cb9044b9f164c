"""The server's doors, round two (#49): each test sends the request that got through before its fix."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import Message, Reply, ScriptedModel
from tenxgraph.core import crashpoints
from tenxgraph.core.tools.context import current_run
from tenxgraph.prebuilt import ReactAgent
from tenxgraph.server.doors import Doors, Refused, client_key, parse_tokens
from tenxgraph.server.limits import Limits
from tenxgraph.storage.checkpointer import SqliteCheckpointer

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from tenxgraph.server import create_app
from tenxgraph.server.recovery import Recovery
from tests.test_server import ROOT, free_port, start_server

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


# -- 4: a run stopped by a limit is not running, and what resumes it keeps its limits -----------------------------
def looping_graph(db: Path, runs: list[str], timeouts: list[float | None] | None = None) -> Any:
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        runs.append(order_id)
        run = current_run()
        (timeouts if timeouts is not None else []).append(run.config.tool_timeout if run is not None else None)
        return "refunded"

    model = ScriptedModel([Reply(tool_calls=[("refund_order", {"order_id": str(i)})]) for i in range(30)])
    return ReactAgent(model, tools=[refund_order]).compile(SqliteCheckpointer(db))


def test_a_run_its_limit_stopped_is_not_recovered(tmp_path: Path) -> None:
    runs: list[str] = []
    graph = looping_graph(tmp_path / "a.db", runs)
    with client(create_app(graph, recovery=False)) as c:
        answer = c.post("/threads/t/runs", json={**RUN, "config": {"recursion_limit": 4}})
        assert answer.status_code == 500 and len(runs) == 2
        meta = c.get("/threads/t/state").json()["values"]["meta"]
    assert meta["status"] == "error" and meta["limits"]["recursion_limit"] == 4  # not "running": nothing to recover
    assert asyncio.run(Recovery(graph).recover("t")) == "gone" and len(runs) == 2


def test_a_recovered_run_keeps_the_limits_it_was_started_with(tmp_path: Path) -> None:
    runs: list[str] = []
    seen: list[float | None] = []
    graph = looping_graph(tmp_path / "a.db", runs, seen)
    config = {"thread_id": "t", "recursion_limit": 4, "tool_timeout": 7.5}
    with crashpoints.armed("node.after_complete", 2), pytest.raises(crashpoints.CrashInjected):
        graph.invoke({"messages": [Message.text_message("go")]}, config)  # killed after its first tool node
    assert len(runs) == 1
    assert asyncio.run(Recovery(graph).recover("t")) == "failed"  # stopped by its own limit again
    assert len(runs) == 2 and seen == [7.5, 7.5]  # 4 nodes in all (not 25 more), with its tool timeout
    state = graph.get_state("t")
    assert state is not None and state.meta.status == "error" and "recursion_limit=4" in str(state.meta.error)


# -- 5, 6: throttling and proxies ---------------------------------------------------------------------------------
class _Request:
    """What :meth:`Doors.enter` reads of a request, from any client address."""

    def __init__(self, host: str, token: str) -> None:
        self.method = "GET"
        self.headers = {"host": "127.0.0.1", "authorization": f"Bearer {token}"}
        self.client = type("Client", (), {"host": host})()


def test_wrong_tokens_are_throttled_per_ipv6_64_and_never_lock_out_the_right_one() -> None:
    doors = Doors(token="s3cret")
    statuses = []
    for i in range(8):  # one host rotating through its /64
        try:
            asyncio.run(doors.enter(_Request(f"2001:db8::{i + 1:x}", f"guess{i}")))
        except Refused as refused:
            statuses.append(refused.status)
    assert statuses == [401] * 6 + [429] * 2
    assert asyncio.run(doors.enter(_Request("2001:db8::99", "s3cret"))) is None  # the right token: let in
    with pytest.raises(Refused) as other:  # another /64 is another client: not locked out
        asyncio.run(doors.enter(_Request("2001:db8:0:1::1", "guess")))
    assert other.value.status == 401
    assert client_key("::ffff:10.0.0.1") == "10.0.0.1" and client_key("10.0.0.1") == "10.0.0.1"


def _wrong_tokens(port: int, forwarded: bool) -> list[int]:
    statuses = []
    for i in range(8):
        headers = {"authorization": f"Bearer guess{i}"}
        if forwarded:
            headers["x-forwarded-for"] = f"203.0.113.{i + 1}"
        request = urllib.request.Request(f"http://127.0.0.1:{port}/threads/t/state", headers=headers)
        try:
            urllib.request.urlopen(request, timeout=10)
        except urllib.error.HTTPError as exc:
            statuses.append(exc.code)
    return statuses


def test_forwarded_addresses_are_trusted_only_from_the_proxies_the_operator_names(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TENX_BACKEND": "sqlite", "TENX_TARGET": str(tmp_path / "s.db"),
           "TENX_EFFECTS": str(tmp_path / "effects.log"), "TENXGRAPH_API_TOKEN": "s3cret"}  # fmt: skip
    port = free_port()
    server = start_server(port, env)
    try:  # a local client rotating X-Forwarded-For is still one address: throttled after 5
        assert _wrong_tokens(port, forwarded=True) == [401] * 6 + [429] * 2
    finally:
        server.terminate()
        server.wait(30)
    port = free_port()
    server = start_server(port, env, "--forwarded-allow-ips", "127.0.0.1")
    try:  # behind a proxy the operator named, each forwarded address is a client of its own
        assert _wrong_tokens(port, forwarded=True) == [401] * 8
    finally:
        server.terminate()
        server.wait(30)


# -- 11: the metrics are the operator's ---------------------------------------------------------------------------
def test_metrics_are_the_operators_not_any_owners(tmp_path: Path) -> None:
    graph = ReactAgent(ScriptedModel(["hi"] * 3), tools=[]).compile(SqliteCheckpointer(tmp_path / "a.db"))
    owners = parse_tokens("alice=ta,bob=tb", "OWNERS")
    with client(create_app(graph, tokens=owners, recovery=False), authorization="Bearer ta") as alice:
        refused = alice.get("/metrics")
        assert refused.status_code == 403 and "--metrics-token-env" in refused.json()["error"]
        assert "tenxgraph_threads_waiting" not in refused.text
    app = create_app(graph, tokens=owners, metrics_token="ops", recovery=False)
    with client(app, authorization="Bearer ta") as alice, client(app, authorization="Bearer ops") as operator:
        assert alice.get("/metrics").status_code == 401  # an owner's token does not open it
        assert alice.post("/threads/t/runs", json=RUN).status_code == 200  # (and it still opens the owner's)
        metrics = operator.get("/metrics")
        assert metrics.status_code == 200 and "tenxgraph_threads_waiting" in metrics.text
        assert operator.get("/threads/t/state").status_code == 401  # the metrics token opens nothing else


# -- 7: slow readers and large states ------------------------------------------------------------------------------
def big_thread(db: Path, thread: str, messages: int, size: int) -> None:
    """A thread stored directly: *messages* user messages of *size* characters each."""
    checkpointer = SqliteCheckpointer(db)
    stored = [Message.text_message("x" * size) for _ in range(messages)]
    values = {"meta": {"current_node": None, "step": 1, "status": "done", "error": None}}
    asyncio.run(checkpointer.aput_thread(thread, values, expected_version=0, new_messages=stored))
    checkpointer.close()


def test_a_threads_messages_come_in_pages(tmp_path: Path) -> None:
    big_thread(tmp_path / "a.db", "t", messages=30, size=1000)
    graph = ReactAgent(ScriptedModel(["hi"]), tools=[]).compile(SqliteCheckpointer(tmp_path / "a.db"))
    with client(create_app(graph, recovery=False, limits=Limits(max_state_page_bytes=5_000))) as c:
        first = c.get("/threads/t/state").json()
        assert len(first["messages"]) == 4 and first["messages_total"] == 30 and first["messages_next"] == 4
        page = c.get("/threads/t/state", params={"messages_from": 28, "messages_limit": 10}).json()
        assert len(page["messages"]) == 2 and page["messages_next"] is None and page["messages_from"] == 28
        for bad in ({"messages_limit": 0}, {"messages_limit": 5000}, {"messages_from": "-1"}):
            answer = c.get("/threads/t/state", params=bad)
            assert answer.status_code == 422 and "must be a whole number" in answer.json()["error"], answer.text


WRITE_TIMEOUT = "1"


def test_a_client_that_stops_reading_is_cut_at_the_write_deadline(tmp_path: Path) -> None:
    """Three clients ask for a 20 MB state and never read it: with four connections allowed, everyone else got
    503 for as long as they held them. The write deadline (1 s here) cuts them, and a fourth client is served."""
    big_thread(tmp_path / "s.db", "big", messages=20, size=1_000_000)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TENX_BACKEND": "sqlite", "TENX_TARGET": str(tmp_path / "s.db"),
           "TENX_EFFECTS": str(tmp_path / "effects.log")}  # fmt: skip
    env.pop("TENXGRAPH_API_TOKEN", None)
    port = free_port()
    flags = (
        "--write-timeout",
        WRITE_TIMEOUT,
        "--limit-concurrency",
        "4",
        "--max-state-page-bytes",
        str(64 * 1024 * 1024),
    )
    server = start_server(port, env, *flags)
    readers = []
    try:
        for _ in range(3):
            reader = socket.socket()
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            reader.connect(("127.0.0.1", port))
            reader.sendall(f"GET /threads/big/state HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            readers.append(reader)
        for reader in readers:  # (a loaded machine may build the 20 MB answer slowly: wait until it is being sent)
            reader.settimeout(60)
            assert reader.recv(1, socket.MSG_PEEK)
        time.sleep(3)  # the deadline passes while they read nothing
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/threads/big/state?messages_limit=1", timeout=10) as ok:
            assert ok.status == 200 and json.loads(ok.read())["messages_total"] == 20
        for reader in readers:  # each was cut: what it reads now ends, short of the 20 MB it asked for
            reader.settimeout(10)
            got = 0
            with contextlib.suppress(ConnectionResetError):
                while chunk := reader.recv(1 << 20):
                    got += len(chunk)
            assert got < 20_000_000
    finally:
        for reader in readers:
            reader.close()
        server.terminate()
        server.wait(30)


# -- 8: one owner's slow sync tools, another owner's runs -------------------------------------------------------------
def test_one_owners_hung_sync_tools_hold_only_its_share_of_the_threads(tmp_path: Path) -> None:
    release = threading.Event()
    entered: list[str] = []

    def wait_for_stock(item: str) -> str:
        """Ask the warehouse (it hangs until released)."""
        entered.append(item)
        release.wait(60)
        return "in stock"

    model = ScriptedModel([Reply(tool_calls=[("wait_for_stock", {"item": "a"})]), "ok"] * 40)
    graph = ReactAgent(model, tools=[wait_for_stock]).compile(SqliteCheckpointer(tmp_path / "a.db"))
    app = create_app(graph, tokens=parse_tokens("alice=ta,bob=tb", "OWNERS"), recovery=False, threads_per_owner=2)
    served: list[int] = []
    with client(app, authorization="Bearer ta") as alice, client(app, authorization="Bearer tb") as bob:
        # alice's 33 runs, each with a tool that hangs: more than the server's 32 threads
        hung = [threading.Thread(target=alice.post, args=(f"/threads/a{i}/runs",), kwargs={"json": RUN})
                for i in range(33)]  # fmt: skip
        bobs = threading.Thread(target=lambda: served.append(bob.post("/threads/b/runs", json=RUN).status_code))
        try:
            for thread in hung:
                thread.start()
            deadline = time.monotonic() + 10
            while len(entered) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)
            assert len(entered) == 2  # alice holds her share, no more
            bobs.start()
            while len(entered) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(entered) == 3  # bob's tool got a thread while alice's hung
        finally:
            release.set()
            for thread in [*hung, bobs]:
                if thread.is_alive():
                    thread.join(60)
    assert served == [200]


def test_a_sync_tool_that_outlives_its_timeout_is_counted_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()

    def slow_lookup(order_id: str) -> str:
        """Look an order up (slowly)."""
        release.wait(30)
        return "found"

    model = ScriptedModel([Reply(tool_calls=[("slow_lookup", {"order_id": "1"})]), "ok"])
    graph = ReactAgent(model, tools=[slow_lookup]).compile(SqliteCheckpointer(tmp_path / "a.db"))
    with client(create_app(graph, recovery=False, limits=Limits(tool_timeout=0.2))) as c, caplog.at_level("WARNING"):
        assert c.post("/threads/t/runs", json=RUN).status_code == 200  # answered with the timeout
        assert "tenxgraph_tool_threads_outliving 1" in c.get("/metrics").text
        release.set()
        deadline = time.monotonic() + 10
        while "tenxgraph_tool_threads_outliving 0" not in c.get("/metrics").text:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert "outlived its caller" in caplog.text and "slow_lookup" in caplog.text
