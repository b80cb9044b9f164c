"""The durable run loop: persistence order, resume, new input, limits, timeouts, bad input."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import Any

import pytest

from tenxgraph import END, AgentState, Message, StateGraph
from tenxgraph.core import crashpoints
from tenxgraph.core.crashpoints import CrashInjected
from tenxgraph.core.graph import current_run
from tenxgraph.core.tools.config import RunConfig
from tenxgraph.errors import (
    ConfigError,
    GraphBuildError,
    GraphRecursionError,
    NodeTimeoutError,
    StaleStateError,
    ThreadBusyError,
)
from tenxgraph.storage.checkpointer import BaseCheckpointer
from tenxgraph.utils.sync import run_sync


@dataclass
class CountState(AgentState):
    visits: list[str] | None = None
    counter: int = 0


def linear_graph(log: list[str], fail_once: set[str] | None = None) -> StateGraph[CountState]:
    """A -> B -> C -> END; each node appends its name to *log* and to ``state.visits``."""
    fail_once = fail_once if fail_once is not None else set()

    def make(name: str) -> Any:
        def node(state: CountState) -> dict[str, Any]:
            log.append(name)
            if name in fail_once:
                fail_once.discard(name)
                raise RuntimeError(f"{name} failed")
            return {"visits": [*(state.visits or []), name], "messages": [Message.assistant(f"from {name}")]}

        return node

    graph = StateGraph(CountState)
    for name in "ABC":
        graph.add_node(name, make(name))
    graph.set_entry_point("A").add_edge("A", "B").add_edge("B", "C").add_edge("C", END)
    return graph


def test_linear_run_persists_result(checkpointer: BaseCheckpointer) -> None:
    log: list[str] = []
    app = linear_graph(log).compile(checkpointer)
    result = app.invoke({"messages": [Message.user("go")]}, {"thread_id": "t1"})
    assert log == ["A", "B", "C"]
    assert result.state.visits == ["A", "B", "C"]
    assert result.status == "done" and result.state.meta.current_node is None and result.state.meta.step == 3
    assert result.final_text == "from C"
    stored = app.get_state("t1")
    assert stored == result.state
    assert [m.message_id for m in checkpointer.list_messages("t1")] == [m.message_id for m in result.messages]


def test_current_node_is_recorded_before_the_node_runs(checkpointer: BaseCheckpointer) -> None:
    seen: list[tuple[str | None, str]] = []

    async def probe(state: AgentState) -> None:
        ctx = current_run()
        assert ctx is not None
        snap = await ctx.checkpointer.aget_thread(ctx.thread_id)
        assert snap is not None
        seen.append((snap.values["meta"]["current_node"], snap.values["meta"]["status"]))

    graph = StateGraph()
    graph.add_node("first", probe).add_node("second", probe)
    graph.set_entry_point("first").add_edge("first", "second").add_edge("second", END)
    graph.compile(checkpointer).invoke({"messages": ["hi"]}, {"thread_id": "t"})
    assert seen == [("first", "running"), ("second", "running")]


def test_resume_from_saved_node_in_a_fresh_graph(checkpointer: BaseCheckpointer) -> None:
    log: list[str] = []
    app = linear_graph(log).compile(checkpointer)
    with crashpoints.armed("run.before_node", hit=2), pytest.raises(CrashInjected):
        app.invoke({"messages": ["go"]}, {"thread_id": "t1"})
    assert log == ["A"]
    snap = checkpointer.get_thread("t1")
    assert snap is not None and snap.values["meta"]["current_node"] == "B"

    fresh = linear_graph(log).compile(checkpointer)  # a new CompiledGraph over the same storage
    result = fresh.invoke(None, {"thread_id": "t1"})
    assert log == ["A", "B", "C"]  # A did not run again
    assert result.state.visits == ["A", "B", "C"]
    assert [m.text for m in result.messages] == ["go", "from A", "from B", "from C"]


def test_crash_after_node_completes_reruns_only_that_node(checkpointer: BaseCheckpointer) -> None:
    log: list[str] = []
    with crashpoints.armed("node.after_complete", hit=2), pytest.raises(CrashInjected):
        linear_graph(log).compile(checkpointer).invoke({"messages": ["go"]}, {"thread_id": "t1"})
    result = linear_graph(log).compile(checkpointer).invoke(None, {"thread_id": "t1"})
    assert log == ["A", "B", "B", "C"]
    assert [m.text for m in result.messages] == [
        "go",
        "from A",
        "from B",
        "from C",
    ]  # B's lost output not kept


def test_failed_node_is_stored_and_retried_on_resume(checkpointer: BaseCheckpointer) -> None:
    log: list[str] = []
    app = linear_graph(log, fail_once={"B"}).compile(checkpointer)
    with pytest.raises(RuntimeError, match="B failed"):
        app.invoke({"messages": ["go"]}, {"thread_id": "t1"})
    state = app.get_state("t1")
    assert state is not None
    assert (state.meta.status, state.meta.current_node) == ("error", "B")
    assert state.meta.error == "RuntimeError in node 'B': B failed"
    result = app.invoke(None, {"thread_id": "t1"})
    assert log == ["A", "B", "B", "C"] and result.status == "done" and result.state.meta.error is None


def test_new_input_on_finished_thread_appends_and_runs_from_entry(checkpointer: BaseCheckpointer) -> None:
    log: list[str] = []
    app = linear_graph(log).compile(checkpointer)
    first = app.invoke({"messages": ["one"]}, {"thread_id": "t1"})
    second = app.invoke({"messages": ["two"]}, {"thread_id": "t1"})
    assert log == ["A", "B", "C"] * 2
    assert [m.text for m in second.messages][:4] == [m.text for m in first.messages]
    assert second.messages[4].text == "two" and len(second.messages) == 8
    assert second.state.meta.step == 6
    # nothing to do: no input, run finished -> state returned unchanged
    assert app.invoke(None, {"thread_id": "t1"}).state == second.state
    assert log == ["A", "B", "C"] * 2


def test_call_on_interrupted_thread_finishes_it_then_runs_new_input(checkpointer: BaseCheckpointer) -> None:
    log: list[str] = []
    first = Message.user("one")
    with crashpoints.armed("run.before_node", hit=2), pytest.raises(CrashInjected):
        linear_graph(log).compile(checkpointer).invoke({"messages": [first]}, {"thread_id": "t1"})
    # a client retry resends the same message (same id): it is not appended twice
    again = linear_graph(log).compile(checkpointer).invoke({"messages": [first]}, {"thread_id": "t1"})
    assert log == ["A", "B", "C"]
    assert [m.text for m in again.messages] == ["one", "from A", "from B", "from C"]
    # genuinely new input on an interrupted thread: the interrupted run finishes first, then the new one runs
    with crashpoints.armed("run.before_node", hit=1), pytest.raises(CrashInjected):
        linear_graph(log).compile(checkpointer).invoke({"messages": ["two"]}, {"thread_id": "t1"})
    result = linear_graph(log).compile(checkpointer).invoke({"messages": ["three"]}, {"thread_id": "t1"})
    texts = [m.text for m in result.messages]
    assert texts[4:] == ["two", "from A", "from B", "from C", "three", "from A", "from B", "from C"]


def test_resume_without_stored_thread_or_input_is_a_clear_error(checkpointer: BaseCheckpointer) -> None:
    app = linear_graph([]).compile(checkpointer)
    with pytest.raises(ConfigError, match="no stored run to resume"):
        app.invoke(None, {"thread_id": "nothing-here"})


def test_recursion_limit_stops_a_runaway_loop_and_stays_resumable(checkpointer: BaseCheckpointer) -> None:
    def tick(state: CountState) -> dict[str, Any]:
        return {"counter": state.counter + 1}

    graph = StateGraph(CountState)
    graph.add_node("tick", tick)
    graph.set_entry_point("tick").add_conditional_edges("tick", lambda s: END if s.counter >= 30 else "tick")
    app = graph.compile(checkpointer)
    with pytest.raises(GraphRecursionError, match="recursion_limit=25"):
        app.invoke({"counter": 0}, {"thread_id": "loop"})
    state = app.get_state("loop")
    assert state is not None and state.counter == 25 and state.meta.current_node == "tick"
    with pytest.raises(GraphRecursionError, match="recursion_limit=3"):
        app.invoke(None, {"thread_id": "loop", "recursion_limit": 3})
    result = app.invoke(None, {"thread_id": "loop", "recursion_limit": 100})
    assert result.state.counter == 30 and result.status == "done"


def test_missing_thread_id_is_generated_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    app = linear_graph([]).compile()
    with caplog.at_level(logging.WARNING, logger="tenxgraph"):
        result = app.invoke({"messages": ["go"]})
    assert result.thread_id_generated and result.thread_id.startswith("thread_")
    assert "Replay protection needs a caller-supplied thread_id" in caplog.text
    assert result.thread_id in caplog.text
    assert app.get_state(result.thread_id) == result.state


def test_a_run_gets_the_documented_timeouts_unless_its_config_says_otherwise() -> None:
    default = RunConfig.parse({"thread_id": "t"})
    assert (default.node_timeout, default.tool_timeout, default.lock_timeout) == (900.0, 300.0, None)
    custom = RunConfig.parse({"thread_id": "t", "node_timeout": 0, "tool_timeout": None, "lock_timeout": 2})
    assert (custom.node_timeout, custom.tool_timeout, custom.lock_timeout) == (None, None, 2.0)


def test_node_timeout_names_node_and_limit(checkpointer: BaseCheckpointer) -> None:
    async def slow(state: AgentState) -> None:
        await asyncio.sleep(30)

    graph = StateGraph()
    graph.add_node("slow_node", slow).set_entry_point("slow_node").add_edge("slow_node", END)
    app = graph.compile(checkpointer)
    with pytest.raises(NodeTimeoutError, match=r"'slow_node'.*node_timeout=0.05s") as info:
        app.invoke({"messages": ["go"]}, {"thread_id": "t", "node_timeout": 0.05})
    assert (info.value.node, info.value.limit) == ("slow_node", 0.05)
    state = app.get_state("t")
    assert state is not None and state.meta.status == "error" and "NodeTimeoutError" in (state.meta.error or "")


@pytest.mark.parametrize("disabled", [None, 0])
def test_zero_or_none_disables_the_node_timeout(disabled: float | None) -> None:
    async def short(state: AgentState) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        return {"messages": [Message.assistant("ok")]}

    graph = StateGraph()
    graph.add_node("n", short).set_entry_point("n").add_edge("n", END)
    result = graph.compile().invoke({"messages": ["go"]}, {"thread_id": "t", "node_timeout": disabled})
    assert result.final_text == "ok"


def test_a_nodes_own_timeout_error_is_not_a_node_timeout() -> None:
    def raises(state: AgentState) -> None:
        raise TimeoutError("upstream API timed out")

    graph = StateGraph()
    graph.add_node("n", raises).set_entry_point("n").add_edge("n", END)
    with pytest.raises(TimeoutError, match="upstream API") as info:
        graph.compile().invoke({"messages": ["go"]}, {"thread_id": "t"})
    assert not isinstance(info.value, NodeTimeoutError)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"thread_id": "t", "node_timeout": "fast"}, "node_timeout must be a number"),
        ({"thread_id": "t", "tool_timeout": True}, "tool_timeout must be a number"),
        ({"thread_id": "t", "tool_timeout": -1}, "tool_timeout must be >= 0"),
        ({"thread_id": "t", "recursion_limit": 0}, "recursion_limit must be a whole number"),
        ({"thread_id": 7}, "thread_id'] must be a non-empty string"),
        ({"thread_id": "t", "threadid": "x"}, r"unknown run config keys \['threadid'\]"),
    ],
)
def test_bad_config_is_a_clear_error(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        linear_graph([]).compile().invoke({"messages": ["go"]}, config)


def test_bad_input_and_bad_node_output_are_clear_errors() -> None:
    app = linear_graph([]).compile()
    with pytest.raises(ConfigError, match="input must be a dict"):
        app.invoke(["go"], {"thread_id": "t"})  # type: ignore[arg-type]
    with pytest.raises(GraphBuildError, match=r"\['colour'\].*does not declare"):
        app.invoke({"colour": "red"}, {"thread_id": "t"})

    graph = StateGraph()
    graph.add_node("n", lambda s: "oops").set_entry_point("n").add_edge("n", END)
    with pytest.raises(GraphBuildError, match="node 'n' returned str"):
        graph.compile().invoke({"messages": ["go"]}, {"thread_id": "t"})


def test_graph_validation_errors() -> None:
    g = StateGraph()
    with pytest.raises(GraphBuildError, match="no entry point"):
        g.compile()
    g.add_node("a", lambda s: None)
    with pytest.raises(GraphBuildError, match="added twice"):
        g.add_node("a", lambda s: None)
    g.set_entry_point("a")
    with pytest.raises(GraphBuildError, match="node 'a' has no outgoing edge"):
        g.compile()
    g.add_edge("a", "b")
    with pytest.raises(GraphBuildError, match="unknown node 'b'"):
        g.compile()
    with pytest.raises(GraphBuildError, match="already has an outgoing edge"):
        g.add_edge("a", END)
    with pytest.raises(GraphBuildError, match="AgentState"):
        StateGraph(dict)  # type: ignore[arg-type]


def test_conditional_edges_with_path_map_and_bad_choice() -> None:
    log: list[str] = []
    g = StateGraph(CountState)
    g.add_node("route", lambda s: log.append("route"))
    g.add_node("left", lambda s: log.append("left"))
    g.set_entry_point("route").add_edge("left", END)
    g.add_conditional_edges("route", lambda s: "go_left" if s.counter == 0 else "nowhere", {"go_left": "left"})
    app = g.compile()
    app.invoke({"counter": 0}, {"thread_id": "t1"})
    assert log == ["route", "left"]
    with pytest.raises(GraphBuildError, match="chose 'nowhere'"):
        app.invoke({"counter": 1}, {"thread_id": "t2"})


def test_sync_nodes_run_off_the_event_loop() -> None:
    threads: list[str] = []
    g = StateGraph()
    g.add_node("n", lambda s: threads.append(threading.current_thread().name))
    g.set_entry_point("n").add_edge("n", END)

    async def main() -> str:
        await g.compile().ainvoke({"messages": ["go"]}, {"thread_id": "t"})
        return threading.current_thread().name

    loop_thread = asyncio.run(main())
    assert threads and threads[0] != loop_thread


def test_concurrent_runs_on_one_thread_one_loses_with_stale_state(checkpointer: BaseCheckpointer) -> None:
    """Two runs of one thread at once: the second finds the thread's run lock held and stops before running
    anything (ThreadBusyError, a StaleStateError); the winner's data stays."""
    gate = asyncio.Event()

    async def wait_for_gate(state: CountState) -> dict[str, Any]:
        await gate.wait()
        return {"counter": state.counter + 1}

    g = StateGraph(CountState)
    g.add_node("n", wait_for_gate).set_entry_point("n").add_edge("n", END)

    async def race() -> list[Any]:
        app = g.compile(checkpointer)
        await app.ainvoke({"counter": 0}, {"thread_id": "t"})  # thread exists, finished
        gate.clear()
        runs = [asyncio.ensure_future(app.ainvoke({"counter": 10}, {"thread_id": "t"})) for _ in range(2)]
        # the holder waits at the gate, so the first run to end is the one refused the lock (no sleep: a loaded
        # machine cannot reorder this); without a lock both would wait here until the timeout
        await asyncio.wait(runs, return_when=asyncio.FIRST_COMPLETED, timeout=30)
        gate.set()
        return await asyncio.gather(*runs, return_exceptions=True)

    gate.set()
    outcomes = run_sync(race())
    errors = [o for o in outcomes if isinstance(o, StaleStateError)]
    assert len(errors) == 1, outcomes
    assert isinstance(errors[0], ThreadBusyError) and "being run by another worker" in str(errors[0])
    snap = checkpointer.get_thread("t")
    assert snap is not None and snap.values["counter"] == 11


def test_invoke_inside_a_running_loop_says_to_await() -> None:
    app = linear_graph([]).compile()

    async def main() -> None:
        app.invoke({"messages": ["go"]}, {"thread_id": "t"})

    with pytest.raises(RuntimeError, match="await the async variant"):
        asyncio.run(main())


def test_stream_yields_node_events_then_the_result(checkpointer: BaseCheckpointer) -> None:
    events = list(linear_graph([]).compile(checkpointer).stream({"messages": ["go"]}, {"thread_id": "t"}))
    assert [e.node for e in events] == ["A", "B", "C", END]
    assert events[0].update == {"visits": ["A"]} and events[0].messages[0].text == "from A"
    final = events[-1].result
    assert final is not None and final.state.visits == ["A", "B", "C"]
