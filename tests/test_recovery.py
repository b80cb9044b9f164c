"""Recovery: a server finishes interrupted threads by itself (on start-up and periodically), leaves a thread
another run holds alone, and parks a thread that kills its worker every time instead of crash-looping."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import Message, ReactAgent, Reply, ScriptedModel
from tenxgraph.core import crashpoints
from tenxgraph.core.crashpoints import CrashInjected
from tenxgraph.server.recovery import Recovery
from tenxgraph.storage.checkpointer import BaseCheckpointer
from tenxgraph.storage.checkpointer.base import hold_run_lock
from tenxgraph.utils.sync import run_sync
from tests.test_server import ROOT, free_port, post_run, server_killed_mid_run, start_server

MSG = {"messages": [Message.text_message("refund order 1042")]}


def agent(cp: BaseCheckpointer, runs: Counter[str], crash: bool = False) -> Any:
    def refund_order(order_id: str) -> str:
        """Refund an order."""
        runs[order_id] += 1
        if crash:  # a call that kills its worker every time (here: the run dies as a killed process would)
            raise CrashInjected("tool.in_flight", 1)
        return f"refunded {order_id}"

    model = ScriptedModel([Reply(tool_calls=[("refund_order", {"order_id": "1042"})]), "Done."])
    return ReactAgent(model, tools=[refund_order]).compile(cp)


def interrupt(cp: BaseCheckpointer, runs: Counter[str], thread: str, point: str = "tool.after_record") -> None:
    with crashpoints.armed(point), pytest.raises(CrashInjected):
        agent(cp, runs).invoke(MSG, {"thread_id": thread})


def test_a_sweep_finishes_interrupted_threads_and_only_them(checkpointer: BaseCheckpointer) -> None:
    runs: Counter[str] = Counter()
    interrupt(checkpointer, runs, "crashed")
    agent(checkpointer, runs).invoke(MSG, {"thread_id": "finished"})
    assert checkpointer.list_interrupted_threads() == ["crashed"]
    outcomes = run_sync(Recovery(agent(checkpointer, runs)).sweep())
    assert outcomes == {"recovered": 1}
    snap = checkpointer.get_thread("crashed")
    assert snap is not None and snap.values["meta"]["status"] == "done"  # type: ignore[index]
    assert snap.values["meta"]["recoveries"] == 1  # type: ignore[index]
    assert runs["1042"] == 2  # once per thread: the crashed thread's recorded call was replayed, not re-run
    assert checkpointer.list_interrupted_threads() == []
    assert run_sync(Recovery(agent(checkpointer, runs)).sweep()) == {}


def test_a_thread_another_run_holds_is_left_alone(checkpointer: BaseCheckpointer) -> None:
    runs: Counter[str] = Counter()
    interrupt(checkpointer, runs, "held")
    recovery = Recovery(agent(checkpointer, runs))

    async def while_held() -> str:
        async with hold_run_lock(checkpointer, "held", None):  # a live run (another request, another server)
            return await recovery.recover("held")

    assert run_sync(while_held()) == "busy"
    assert checkpointer.list_interrupted_threads() == ["held"]  # untouched, and no attempt counted
    assert run_sync(recovery.recover("held")) == "recovered"


def test_a_thread_that_kills_its_worker_every_time_is_parked(
    checkpointer: BaseCheckpointer, caplog: pytest.LogCaptureFixture
) -> None:
    runs: Counter[str] = Counter()
    interrupt(checkpointer, runs, "doomed", point="tool.before_invoke")
    now = [0.0]
    recovery = Recovery(agent(checkpointer, runs, crash=True), max_attempts=2, interval=30, clock=lambda: now[0])
    with pytest.raises(CrashInjected):  # the recovery dies with its "worker"; the attempt was counted first
        run_sync(recovery.sweep())
    now[0] = 29.0
    assert run_sync(recovery.sweep()) == {"backing_off": 1}  # not again before 1 interval, then 2, 4...
    now[0] = 30.0
    with pytest.raises(CrashInjected):
        run_sync(recovery.sweep())
    now[0] = 89.0
    assert run_sync(recovery.sweep()) == {"backing_off": 1}  # 2 intervals now
    now[0] = 90.0
    with caplog.at_level("ERROR", logger="tenxgraph.events"):
        assert run_sync(recovery.sweep()) == {"parked": 1}
        assert run_sync(recovery.sweep()) == {"parked": 1}  # still parked, logged once
    parked = [json.loads(r.getMessage()) for r in caplog.records if "recovery_parked" in r.getMessage()]
    assert len(parked) == 1 and parked[0]["thread_id"] == "doomed" and parked[0]["attempts"] == 2
    assert runs["1042"] == 2  # two attempts, then no more
    # a client's own request still resumes it once the cause is fixed
    assert agent(checkpointer, runs).invoke(None, {"thread_id": "doomed"}).final_text == "Done."


def test_bad_recovery_settings_are_refused() -> None:
    graph = agent(__import__("tenxgraph").InMemoryCheckpointer(), Counter())
    with pytest.raises(ValueError, match="interval > 0 seconds"):
        Recovery(graph, interval=0)


def get_state(port: int, thread: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/threads/{thread}/state", timeout=10) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_restarted_server_finishes_the_thread_its_crash_interrupted_without_any_request(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    port, env = server_killed_mid_run(backend, tmp_path, request)  # and the client never retries
    effects = tmp_path / "effects.log"
    env.pop(crashpoints.ENV_CRASH_AT, None)
    restarted = start_server(port, env)  # recovery sweeps on start-up
    try:
        deadline, state = time.monotonic() + 30, get_state(port, "ticket-1042")
        while state["status"] != "done" and time.monotonic() < deadline:
            time.sleep(0.1)
            state = get_state(port, "ticket-1042")
    finally:
        restarted.terminate()
        restarted.wait(timeout=30)
    assert state["status"] == "done" and state["values"]["meta"]["recoveries"] == 1
    assert effects.read_text().splitlines() == ["1042 20.0"]  # refund_order ran once
    assert restarted.stdout is not None
    events = [json.loads(line) for line in restarted.stdout.read().decode().splitlines() if line.startswith("{")]
    recovered = [e for e in events if e.get("event") == "run_recovered"]
    assert [e["thread_id"] for e in recovered] == ["ticket-1042"]
    assert not [e for e in events if e.get("event") == "request" and e["method"] == "POST"]  # nobody asked


def test_sigterm_lets_a_running_run_finish_and_loses_no_run(tmp_path: Path) -> None:
    """SIGTERM: the server stops taking requests and lets the run in progress finish (within --shutdown-timeout);
    nothing is cut, nothing is run twice."""
    import signal
    import threading

    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TENX_BACKEND": "sqlite",
        "TENX_TARGET": str(tmp_path / "server.db"),
        "TENX_EFFECTS": str(tmp_path / "effects.log"),
        "TENX_SLOW_S": "1.5",  # the refund takes a while: SIGTERM arrives while it runs
    }
    port = free_port()
    server = start_server(port, env)
    answers: list[dict[str, Any]] = []
    answered: list[float] = []
    client = threading.Thread(target=lambda: (answers.append(post_run(port, "slow-1")), answered.append(time.time())))
    client.start()
    time.sleep(0.5)
    signalled = time.time()
    server.send_signal(signal.SIGTERM)
    client.join(timeout=30)
    assert answered and answered[0] > signalled  # answered after SIGTERM: the run was let finish
    assert server.wait(timeout=30) in (0, -signal.SIGTERM)  # (uvicorn re-raises SIGTERM once it has shut down)
    assert answers and answers[0]["status"] == "done"  # the run in progress finished and was answered
    assert (tmp_path / "effects.log").read_text().splitlines() == ["1042 20.0"]


def test_several_workers_on_one_port_share_the_threads(tmp_path: Path) -> None:
    """``--workers 2``: two processes answer on one port; each thread's calls run once, whichever worker ran it."""
    from concurrent.futures import ThreadPoolExecutor

    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TENX_BACKEND": "sqlite",
        "TENX_TARGET": str(tmp_path / "server.db"),
        "TENX_EFFECTS": str(tmp_path / "effects.log"),
    }
    port = free_port()
    server = start_server(port, env, "--workers", "2")
    try:
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda i: post_run(port, f"w-{i}"), range(6)))
        again = post_run(port, "w-0")  # the same request again: answered from the thread, nothing re-run
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert all(a["status"] == "done" for a in answers) and again["status"] == "done"
    assert (tmp_path / "effects.log").read_text().splitlines() == ["1042 20.0"] * 6  # one refund per thread
    assert server.stdout is not None
    events = [json.loads(line) for line in server.stdout.read().decode().splitlines() if line.startswith("{")]
    assert len([e for e in events if e.get("event") == "server_start"]) == 2  # two worker processes
