"""The replay-safe ledger contract (issue: ledger in the invoke-node handler), one test per statement."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from tenxgraph import AgentState, Message, ReactAgent, Reply, ScriptedModel, ToolCallBlock, ToolOutput
from tenxgraph.core import crashpoints
from tenxgraph.core.crashpoints import CrashInjected
from tenxgraph.core.graph import current_run
from tenxgraph.core.graph.utils.invoke_node_handler import ledger_key
from tenxgraph.storage.checkpointer import BaseCheckpointer
from tests.helpers import SpyCheckpointer

MSG = [Message.text_message("refund order 1042")]


class ToolRuns:
    """Counts real executions of tool bodies by name."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.outputs: dict[str, list[str]] = {}

    def tool(self, name: str, output: Any = None) -> Any:
        def body() -> Any:
            self.runs[name] += 1
            value = output if output is not None else f"{name}-{uuid.uuid4().hex[:8]}"
            self.outputs.setdefault(name, []).append(value)
            return value

        body.__name__ = name
        body.__doc__ = f"The {name} tool."
        return body


def agent(cp: BaseCheckpointer, script: list[Any], tools: list[Any], state: type[AgentState] = AgentState) -> Any:
    return ReactAgent(ScriptedModel(script), tools=tools, state_schema=state).compile(cp)


def test_ledger_key_combines_message_id_and_tool_call_id() -> None:
    assert ledger_key("msg_1", "call_1") == "msg_1:call_1"
    assert ledger_key("msg_1", None) is None and ledger_key("", "call_1") is None


def test_call_ids_repeat_every_turn_but_keys_do_not(checkpointer: BaseCheckpointer) -> None:
    fx = ToolRuns()
    script = [Reply(tool_calls=[("send_email", {})]), Reply(tool_calls=[("send_email", {})]), "sent twice"]
    result = agent(checkpointer, script, [fx.tool("send_email")]).invoke({"messages": MSG}, {"thread_id": "t"})
    assert fx.runs["send_email"] == 2  # the second call_1 is a new call, not a replay of the first
    assistants = [m for m in result.messages if m.tool_calls]
    assert [m.tool_calls[0].id for m in assistants] == ["call_1", "call_1"]
    keys = set(checkpointer.list_tool_results("t"))
    assert keys == {f"{m.message_id}:call_1" for m in assistants}


def test_recorded_call_is_replayed_not_rerun(checkpointer: BaseCheckpointer) -> None:
    fx = ToolRuns()
    tools = [fx.tool("lookup_order"), fx.tool("refund_order")]
    script = [Reply(tool_calls=[("lookup_order", {})]), Reply(tool_calls=[("refund_order", {})]), "done"]
    # node.after_complete: hit 1 MAIN, 2 TOOL(lookup), 3 MAIN, 4 TOOL(refund): the refund ran and was recorded
    with crashpoints.armed("node.after_complete", hit=4), pytest.raises(CrashInjected):
        agent(checkpointer, script, tools).invoke({"messages": MSG}, {"thread_id": "t"})
    assert fx.runs == {"lookup_order": 1, "refund_order": 1}
    result = agent(checkpointer, script, tools).invoke(None, {"thread_id": "t"})
    assert fx.runs == {"lookup_order": 1, "refund_order": 1}
    refund_msg = result.messages[4]
    assert refund_msg.tool_results[0].output == fx.outputs["refund_order"][0]  # same output the model would have seen
    assert not refund_msg.tool_results[0].is_error and refund_msg.metadata.get("replayed") is True
    assert result.final_text == "done"


def test_replay_restores_error_flag_and_state_update(checkpointer: BaseCheckpointer) -> None:
    @dataclass
    class S(AgentState):
        refunded: float = 0.0

    runs: Counter[str] = Counter()

    def refund(amount: float) -> ToolOutput:
        """Refund."""
        runs["refund"] += 1
        return ToolOutput(f"refunded {amount}", update={"refunded": amount})

    def flaky() -> str:
        """Fails."""
        runs["flaky"] += 1
        raise ConnectionError("provider down")

    script = [Reply(tool_calls=[("refund", {"amount": 5.0}), ("flaky", {})]), "done"]
    with crashpoints.armed("node.after_complete", hit=2), pytest.raises(CrashInjected):
        agent(checkpointer, script, [refund, flaky], S).invoke({"messages": MSG}, {"thread_id": "t"})
    result = agent(checkpointer, script, [refund, flaky], S).invoke(None, {"thread_id": "t"})
    assert runs == {"refund": 1, "flaky": 1}  # a tool that raised is recorded too: not re-run
    assert result.state.refunded == 5.0  # the recorded state update is applied on replay
    refund_result, flaky_result = (m.tool_results[0] for m in result.messages if m.role == "tool")
    assert (refund_result.output, refund_result.is_error) == ("refunded 5.0", False)
    assert (flaky_result.output, flaky_result.is_error) == ("ConnectionError: provider down", True)


def test_regenerated_assistant_message_gets_new_keys(checkpointer: BaseCheckpointer) -> None:
    fx = ToolRuns()
    generated: list[Message] = []
    scripted = ScriptedModel([Reply(tool_calls=[("refund_order", {})]), "done"])

    class Recording:
        async def agenerate(self, messages: Any, tools: Any) -> Message:
            reply = await scripted.agenerate(messages, tools)
            generated.append(reply)
            return reply

    def app() -> Any:
        return ReactAgent(Recording(), tools=[fx.tool("refund_order")]).compile(checkpointer)

    # the model node completed but the run did not advance: its message is lost and will be regenerated
    with crashpoints.armed("node.after_complete", hit=1), pytest.raises(CrashInjected):
        app().invoke({"messages": MSG}, {"thread_id": "t"})
    result = app().invoke(None, {"thread_id": "t"})
    first, second = generated[0], generated[1]
    assert first.message_id != second.message_id and first.tool_calls == second.tool_calls
    assert result.messages[1].message_id == second.message_id
    assert set(checkpointer.list_tool_results("t")) == {f"{second.message_id}:call_1"}
    assert fx.runs["refund_order"] == 1


def test_missing_ids_run_unprotected_with_a_warning(
    checkpointer: BaseCheckpointer, caplog: pytest.LogCaptureFixture
) -> None:
    fx = ToolRuns()
    no_id = Message.assistant("", [ToolCallBlock(None, "refund_order", {})])
    with (
        caplog.at_level(logging.WARNING, logger="tenxgraph"),
        crashpoints.armed("node.after_complete", hit=2),
        pytest.raises(CrashInjected),
    ):
        agent(checkpointer, [no_id, "done"], [fx.tool("refund_order")]).invoke({"messages": MSG}, {"thread_id": "t"})
    assert "has no tool_call_id: it runs without replay protection (thread 't')" in caplog.text
    assert checkpointer.list_tool_results("t") == {}
    agent(checkpointer, [no_id, "done"], [fx.tool("refund_order")]).invoke(None, {"thread_id": "t"})
    assert fx.runs["refund_order"] == 2  # documented gap: no key, no protection


def test_node_reads_all_keys_in_one_batch(checkpointer: BaseCheckpointer) -> None:
    fx = ToolRuns()
    spy = SpyCheckpointer(checkpointer)
    script = [Reply(tool_calls=[("a", {}), ("b", {}), ("c", {})]), "done"]
    result = agent(spy, script, [fx.tool("a"), fx.tool("b"), fx.tool("c")]).invoke(
        {"messages": MSG}, {"thread_id": "t"}
    )
    assert spy.calls["get_tool_results"] == 1
    assistant = result.messages[1]
    assert spy.ledger_reads == [[f"{assistant.message_id}:call_{i}" for i in (1, 2, 3)]]
    assert spy.calls["put_tool_result"] == 3


def sibling_probe(sibling_key_suffix: str) -> Any:
    """An async tool that returns only once the sibling's ledger record is visible in storage."""

    async def waits_for_sibling() -> str:
        """Waits."""
        ctx = current_run()
        assert ctx is not None
        for _ in range(500):
            records = await ctx.checkpointer.alist_tool_results(ctx.thread_id)
            if any(k.endswith(sibling_key_suffix) for k in records):
                return "sibling was recorded first"
            await asyncio.sleep(0.01)
        return "sibling record never appeared"

    return waits_for_sibling


def test_each_record_is_written_as_soon_as_its_tool_returns(checkpointer: BaseCheckpointer) -> None:
    fx = ToolRuns()
    script = [Reply(tool_calls=[("fast", {}), ("waits_for_sibling", {})]), "done"]
    tools = [fx.tool("fast"), sibling_probe(":call_1")]
    result = agent(checkpointer, script, tools).invoke({"messages": MSG}, {"thread_id": "t"})
    assert result.messages[3].tool_results[0].output == "sibling was recorded first"


def test_parallel_crash_after_sibling_finished_does_not_rerun_sibling(checkpointer: BaseCheckpointer) -> None:
    fx = ToolRuns()
    slow_runs: list[int] = []
    probe = sibling_probe(":call_1")

    async def slow() -> str:
        """Slow."""
        slow_runs.append(1)
        return await probe()

    script = [Reply(tool_calls=[("refund", {}), ("slow", {})]), "done"]
    # tool.after_record: hit 1 is refund's record; hit 2 is slow's record -> crash, node not complete
    with crashpoints.armed("tool.after_record", hit=2), pytest.raises(CrashInjected):
        agent(checkpointer, script, [fx.tool("refund"), slow]).invoke({"messages": MSG}, {"thread_id": "t"})
    result = agent(checkpointer, script, [fx.tool("refund"), slow]).invoke(None, {"thread_id": "t"})
    assert fx.runs["refund"] == 1 and len(slow_runs) == 1
    assert [m.tool_results[0].call_id for m in result.messages if m.role == "tool"] == ["call_1", "call_2"]


def test_crash_in_one_call_stops_unfinished_siblings(checkpointer: BaseCheckpointer) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def long_running() -> str:
        """Long."""
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    async def quick() -> str:
        """Returns (and crashes) once its sibling is running."""
        await started.wait()
        return "ok"

    script = [Reply(tool_calls=[("quick", {}), ("long_running", {})]), "done"]
    with crashpoints.armed("tool.after_return", hit=1), pytest.raises(CrashInjected):
        agent(checkpointer, script, [quick, long_running]).invoke({"messages": MSG}, {"thread_id": "t"})
    assert cancelled.is_set()
    assert checkpointer.list_tool_results("t") == {}


def test_gap_crash_after_return_before_record_reruns_the_tool(checkpointer: BaseCheckpointer) -> None:
    fx = ToolRuns()
    script = [Reply(tool_calls=[("refund_order", {})]), "done"]
    with crashpoints.armed("tool.after_return", hit=1), pytest.raises(CrashInjected):
        agent(checkpointer, script, [fx.tool("refund_order")]).invoke({"messages": MSG}, {"thread_id": "t"})
    agent(checkpointer, script, [fx.tool("refund_order")]).invoke(None, {"thread_id": "t"})
    assert fx.runs["refund_order"] == 2  # documented gap: the window between return and record


def test_timeout_is_not_recorded(checkpointer: BaseCheckpointer) -> None:
    runs: list[int] = []

    async def hang() -> str:
        """Hangs."""
        runs.append(1)
        await asyncio.sleep(30)
        return "never"

    script = [Reply(tool_calls=[("hang", {})]), "done"]
    config = {"thread_id": "t", "tool_timeout": 0.05}
    with crashpoints.armed("node.after_complete", hit=2), pytest.raises(CrashInjected):
        agent(checkpointer, script, [hang]).invoke({"messages": MSG}, config)
    assert checkpointer.list_tool_results("t") == {}
    result = agent(checkpointer, script, [hang]).invoke(None, config)
    assert len(runs) == 2  # documented gap: a timed-out call may have had its effect and runs again
    assert result.messages[2].tool_results[0].status == "timeout"


def test_ledger_read_failure_warns_and_runs_the_tool(
    checkpointer: BaseCheckpointer, caplog: pytest.LogCaptureFixture
) -> None:
    fx = ToolRuns()
    script = [Reply(tool_calls=[("refund_order", {})]), "done"]
    with crashpoints.armed("node.after_complete", hit=2), pytest.raises(CrashInjected):
        agent(checkpointer, script, [fx.tool("refund_order")]).invoke({"messages": MSG}, {"thread_id": "t"})
    [key] = checkpointer.list_tool_results("t")
    with caplog.at_level(logging.WARNING, logger="tenxgraph"), crashpoints.armed("ledger.read_error"):
        result = agent(checkpointer, script, [fx.tool("refund_order")]).invoke(None, {"thread_id": "t"})
    assert fx.runs["refund_order"] == 2 and result.final_text == "done"
    [record] = [r for r in caplog.records if "ledger read failed" in r.getMessage()]
    assert record.levelno == logging.WARNING
    text = record.getMessage()
    assert "'refund_order'" in text and repr(key) in text and "'t'" in text and "never ran is worse" in text


def test_ledger_write_failure_logs_error_and_the_run_continues(
    checkpointer: BaseCheckpointer, caplog: pytest.LogCaptureFixture
) -> None:
    fx = ToolRuns()
    script = [Reply(tool_calls=[("refund_order", {})]), "done"]
    with caplog.at_level(logging.ERROR, logger="tenxgraph"), crashpoints.armed("ledger.write_error"):
        result = agent(checkpointer, script, [fx.tool("refund_order")]).invoke({"messages": MSG}, {"thread_id": "t"})
    assert result.final_text == "done" and fx.runs["refund_order"] == 1
    assert checkpointer.list_tool_results("t") == {}
    [record] = [r for r in caplog.records if "was not recorded" in r.getMessage()]
    key = f"{result.messages[1].message_id}:call_1"
    text = record.getMessage()
    assert record.levelno == logging.ERROR
    assert "'refund_order' completed" in text and repr(key) in text and "'t'" in text and "may run again" in text


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (object(), "is not JSON serializable"),
        ("refund id \x00 42", "NUL character"),
        ("half a pair: \ud83d", "not valid UTF-8"),
    ],
    ids=["not-json", "nul", "lone-surrogate"],
)
def test_a_result_no_backend_can_store_is_a_recorded_error_and_never_runs_again(
    checkpointer: BaseCheckpointer, caplog: pytest.LogCaptureFixture, value: object, reason: str
) -> None:
    """Before, a NUL or a lone surrogate passed json.dumps, then the record and state writes failed with raw
    driver errors, and every resume ran the tool again (a refund ran 3 times in 3 attempts). Now every backend
    refuses the value the same way: the model gets an error result naming the tool, it is recorded, the run goes
    on, and a resume after a crash replays the error instead of running the tool again."""
    runs: list[str] = []

    def refund_order() -> object:
        """Returns what a provider sent back."""
        runs.append("refund")
        return value

    script = [Reply(tool_calls=[("refund_order", {})]), "done"]
    crash = crashpoints.armed("node.after_complete", hit=2)  # the tool node completed; the run did not advance
    with caplog.at_level(logging.ERROR, logger="tenxgraph"), pytest.raises(CrashInjected), crash:
        agent(checkpointer, script, [refund_order]).invoke({"messages": MSG}, {"thread_id": "t"})
    assert "'refund_order' returned a value that cannot be stored" in caplog.text and reason in caplog.text
    [record] = checkpointer.list_tool_results("t").values()
    assert record["is_error"] and reason in str(record["output"])
    result = agent(checkpointer, script, [refund_order]).invoke(None, {"thread_id": "t"})
    assert runs == ["refund"]  # recorded: the resume replayed the error
    tool_result = result.messages[2].tool_results[0]
    assert tool_result.is_error and "tool 'refund_order' returned a value that cannot be stored" in str(
        tool_result.output
    )
    assert result.final_text == "done"


def test_streaming_runs_use_the_ledger_and_flag_replays(checkpointer: BaseCheckpointer) -> None:
    fx = ToolRuns()
    script = [Reply(tool_calls=[("refund_order", {})]), "done"]
    with crashpoints.armed("node.after_complete", hit=2), pytest.raises(CrashInjected):
        list(agent(checkpointer, script, [fx.tool("refund_order")]).stream({"messages": MSG}, {"thread_id": "t"}))
    assert len(checkpointer.list_tool_results("t")) == 1  # recorded while streaming
    events = list(agent(checkpointer, script, [fx.tool("refund_order")]).stream(None, {"thread_id": "t"}))
    assert fx.runs["refund_order"] == 1  # replayed, not re-run
    tool_event = next(e for e in events if e.node == "TOOL")
    assert tool_event.replayed and tool_event.messages[0].metadata["replayed"] is True
    assert not any(e.replayed for e in events if e.node != "TOOL")
    assert events[-1].result is not None and events[-1].result.final_text == "done"


def test_prune_keeps_the_ledger_of_an_interrupted_run(checkpointer: BaseCheckpointer) -> None:
    fx = ToolRuns()
    script = [Reply(tool_calls=[("refund_order", {})]), "done"]
    with crashpoints.armed("tool.after_record", hit=1), pytest.raises(CrashInjected):
        agent(checkpointer, script, [fx.tool("refund_order")]).invoke({"messages": MSG}, {"thread_id": "t"})
    time.sleep(0.01)
    checkpointer.prune_tool_executions(timedelta(0))  # the thread is resumable: its records stay
    agent(checkpointer, script, [fx.tool("refund_order")]).invoke(None, {"thread_id": "t"})
    assert fx.runs["refund_order"] == 1
    checkpointer.prune_tool_executions(timedelta(0))  # finished now: prunable
    assert checkpointer.list_tool_results("t") == {}


def test_a_repeated_tool_call_id_in_one_message_never_merges_two_calls(
    checkpointer: BaseCheckpointer, caplog: pytest.LogCaptureFixture
) -> None:
    """A model that repeats a tool_call_id in one message: before, both calls got one key and one result message
    id, the second result was dropped, and after a crash the second refund was "replayed" with the first's result.
    Now each call runs, is recorded and answered on its own, with a warning; a resume replays each its own result."""
    refunds: list[str] = []

    def refund_order(order_id: str) -> str:
        """Refund an order."""
        refunds.append(order_id)
        return f"refunded {order_id}"

    script = [
        Reply(
            tool_calls=[
                ("refund_order", {"order_id": "1042"}, "call_1"),
                ("refund_order", {"order_id": "2001"}, "call_1"),
            ]
        ),
        "done",
    ]
    crash = crashpoints.armed("tool.after_record", hit=1)  # one of the two is recorded, then the process dies
    with caplog.at_level(logging.WARNING, logger="tenxgraph"), pytest.raises(CrashInjected), crash:
        agent(checkpointer, script, [refund_order]).invoke({"messages": MSG}, {"thread_id": "t"})
    assert "repeats tool_call_id(s) call_1" in caplog.text
    result = agent(checkpointer, script, [refund_order]).invoke(None, {"thread_id": "t"})
    outputs = sorted(r.output for m in result.messages for r in m.tool_results)
    assert outputs == ["refunded 1042", "refunded 2001"]  # two results, each its own call's
    assert len(checkpointer.list_tool_results("t")) == 2
    assert sorted(set(refunds)) == ["1042", "2001"] and len(refunds) <= 3  # both ran; only an unrecorded one again
    assert len({m.message_id for m in result.messages}) == len(result.messages)


def test_a_record_of_a_newer_format_is_refused_never_misread(checkpointer: BaseCheckpointer) -> None:
    """The record format carries its version; a runtime that cannot read it stops instead of guessing."""
    from tenxgraph.errors import SerializationError

    runs: list[str] = []

    def refund_order() -> str:
        """Refund."""
        runs.append("refund")
        return "refunded"

    script = [Reply(tool_calls=[("refund_order", {})]), "done"]
    with crashpoints.armed("tool.before_invoke", hit=1), pytest.raises(CrashInjected):
        agent(checkpointer, script, [refund_order]).invoke({"messages": MSG}, {"thread_id": "t"})
    [assistant] = [m for m in checkpointer.list_messages("t") if m.role == "assistant"]
    key = ledger_key(assistant.message_id, assistant.tool_calls[0].id)
    assert key is not None
    checkpointer.put_tool_result("t", key, {"v": 99, "kind": "value", "tool": "refund_order", "output": "?"})
    with pytest.raises(SerializationError, match="format version 99; this runtime reads versions up to 1"):
        agent(checkpointer, script, [refund_order]).invoke(None, {"thread_id": "t"})
    assert runs == []  # not run again either


def test_the_ledger_is_called_without_our_run_loop(checkpointer: BaseCheckpointer) -> None:
    """What an integration does (a LangGraph node, an MCP tool): call the ledger with a message, the tools, a
    checkpointer and a thread. The call is recorded on that thread, its body sees its own call (not a run), and a
    second call with the same message replays the record instead of running the body again."""
    from tenxgraph.core.graph.utils.invoke_node_handler import invoke_tool_calls
    from tenxgraph.core.tools.context import current_tool_call
    from tenxgraph.core.tools.tool import Tool

    seen: list[tuple[str | None, bool]] = []

    def refund(order_id: str) -> str:
        call = current_tool_call()
        seen.append((call.key if call is not None else None, current_run() is None))
        return f"refunded {order_id}"

    tools = {"refund": Tool.from_function(refund)}
    message = Message.assistant(tool_calls=[ToolCallBlock("call_1", "refund", {"order_id": "A1"})])

    async def scenario() -> tuple[Any, ...]:  # (one event loop: a PostgreSQL pool belongs to the loop that opened it)
        first = await invoke_tool_calls(message, tools, checkpointer, "outside")
        again = await invoke_tool_calls(message, tools, checkpointer, "outside")
        other = await invoke_tool_calls(message, tools, checkpointer, "another thread")
        stored = await checkpointer.alist_tool_results("outside")
        await checkpointer.aclose()  # (in the loop that opened it; the fixture's close then has nothing left to do)
        return first, again, other, stored

    first, again, other, stored = asyncio.run(scenario())
    key = f"{message.message_id}:call_1"
    assert seen == [(key, True), (key, True)]  # two executions (one per thread), each knowing its key, in no run
    assert [(e.result.output, e.recorded, e.replayed) for e in first] == [("refunded A1", True, False)]
    assert [(e.result.output, e.replayed) for e in again] == [("refunded A1", True)]
    assert [e.replayed for e in other] == [False]  # the thread given is the ledger used
    assert set(stored) == {key}
