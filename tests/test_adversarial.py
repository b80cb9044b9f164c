"""Adversarial inputs on every backend (memory, SQLite, PostgreSQL, PostgreSQL + Redis): each gets a clear error
or its documented behaviour, the same on every backend, nothing half-written, and a resume afterwards still runs
every recorded call at most once. docs/replay-safe-tools.md has the table of what each input gets."""

from __future__ import annotations

from typing import Any

import pytest

from tenxgraph import Message, ReactAgent, Reply, ScriptedModel
from tenxgraph.core import crashpoints
from tenxgraph.core.crashpoints import CrashInjected
from tenxgraph.errors import ConfigError, GraphBuildError, SerializationError
from tenxgraph.models.base import ChatModel
from tenxgraph.state.messages import ToolCallBlock
from tenxgraph.storage.checkpointer import BaseCheckpointer

GOOD_IDS = {
    "quotes": 'it\'s "quoted"',
    "sql": "'; DROP TABLE threads; --",
    "unicode": "café-Ωmega-Заказ",
    "emoji": "🧾-1042-✅",
    "512-bytes": "x" * 512,
}
BAD_IDS = {
    "nul": ("order\x00-1042", "must not contain a NUL character"),
    "4-kb": ("x" * 4096, "is 4096 bytes long; the limit is 512 bytes"),
    "empty": ("", "must be a non-empty string"),
    "lone-surrogate": ("order-\udc00", "must be valid UTF-8"),
}


def refund_agent(cp: BaseCheckpointer, runs: list[str], output: Any = None) -> Any:
    def refund_order(order_id: str) -> Any:
        """Refund an order."""
        runs.append(order_id)
        return output if output is not None else f"refunded {order_id}"

    model = ScriptedModel([Reply(tool_calls=[("refund_order", {"order_id": "1042"})]), "done"])
    return ReactAgent(model, tools=[refund_order]).compile(cp)


def crash_then_resume(cp: BaseCheckpointer, thread: str, output: Any = None) -> tuple[Any, list[str]]:
    runs: list[str] = []
    with crashpoints.armed("tool.after_record", hit=1), pytest.raises(CrashInjected):
        refund_agent(cp, runs, output).invoke({"messages": ["refund 1042"]}, {"thread_id": thread})
    result = refund_agent(cp, runs, output).invoke(None, {"thread_id": thread})
    return result, runs


@pytest.mark.parametrize("thread", GOOD_IDS.values(), ids=GOOD_IDS.keys())
def test_unusual_but_valid_thread_ids_work_and_resume_at_most_once(checkpointer: BaseCheckpointer, thread: str) -> None:
    result, runs = crash_then_resume(checkpointer, thread)
    assert result.final_text == "done" and runs == ["1042"]
    snap = checkpointer.get_thread(thread)
    assert snap is not None and snap.values["meta"]["status"] == "done"
    assert len(checkpointer.list_tool_results(thread)) == 1


@pytest.mark.parametrize(("thread", "message"), BAD_IDS.values(), ids=BAD_IDS.keys())
def test_invalid_thread_ids_are_one_clear_error_before_anything_is_written(
    checkpointer: BaseCheckpointer, thread: str, message: str
) -> None:
    runs: list[str] = []
    with pytest.raises(ConfigError, match=message):
        refund_agent(checkpointer, runs).invoke({"messages": ["refund 1042"]}, {"thread_id": thread})
    with pytest.raises(ConfigError, match=message):  # the checkpointer itself applies the same rule
        checkpointer.put_thread(thread, {}, expected_version=0)
    assert runs == []


@pytest.mark.parametrize(
    ("text", "message"),
    [("refund\x00 1042", "NUL character"), ("refund \udc00 1042", "not valid UTF-8")],
    ids=["nul", "lone-surrogate"],
)
def test_user_text_no_backend_can_store_is_refused_before_the_run_exists(
    checkpointer: BaseCheckpointer, text: str, message: str
) -> None:
    runs: list[str] = []
    with pytest.raises(SerializationError, match=message):
        refund_agent(checkpointer, runs).invoke({"messages": [text]}, {"thread_id": "t"})
    assert checkpointer.get_thread("t") is None and runs == []


def test_a_one_megabyte_result_is_recorded_and_replayed_intact(checkpointer: BaseCheckpointer) -> None:
    big = {"rows": ["é" * 1000] * 1000, "n": 1000}  # ~2 MB of UTF-8 once encoded
    result, runs = crash_then_resume(checkpointer, "big", output=big)
    assert runs == ["1042"] and result.messages[2].tool_results[0].output == big


def test_arguments_that_do_not_match_the_schema_and_unknown_tools_get_error_results(
    checkpointer: BaseCheckpointer,
) -> None:
    """The model sees an error result it can act on; nothing ran, so nothing is recorded; the run finishes."""
    runs: list[str] = []

    def refund_order(order_id: str) -> str:
        """Refund an order."""
        runs.append(order_id)
        return "refunded"

    script = [Reply(tool_calls=[("refund_order", {"order": 1042}), ("delete_everything", {})]), "done"]
    app = ReactAgent(ScriptedModel(script), tools=[refund_order]).compile(checkpointer)
    result = app.invoke({"messages": ["refund 1042"]}, {"thread_id": "t"})
    bad_args, unknown = result.messages[2].tool_results[0], result.messages[3].tool_results[0]
    assert bad_args.is_error and "order_id" in str(bad_args.output)
    assert unknown.is_error and "unknown tool 'delete_everything'" in str(unknown.output)
    assert "available tools: refund_order" in str(unknown.output)
    assert runs == [] and checkpointer.list_tool_results("t") == {} and result.final_text == "done"


def test_a_call_without_a_tool_call_id_runs_unprotected_with_a_warning(
    checkpointer: BaseCheckpointer, caplog: pytest.LogCaptureFixture
) -> None:
    """The documented missing_ids gap: no key, so no record; a crash after it runs it again."""
    runs: list[str] = []

    def refund_order(order_id: str) -> str:
        """Refund an order."""
        runs.append(order_id)
        return "refunded"

    script = [Reply(tool_calls=[("refund_order", {"order_id": "1042"}, None)]), "done"]
    with caplog.at_level("WARNING", logger="tenxgraph"):
        with crashpoints.armed("node.after_complete", hit=2), pytest.raises(CrashInjected):
            ReactAgent(ScriptedModel(script), tools=[refund_order]).compile(checkpointer).invoke(
                {"messages": ["go"]}, {"thread_id": "t"}
            )
        result = (
            ReactAgent(ScriptedModel(script), tools=[refund_order])
            .compile(checkpointer)
            .invoke(None, {"thread_id": "t"})
        )
    assert "has no tool_call_id: it runs without replay protection" in caplog.text
    assert runs == ["1042", "1042"] and result.final_text == "done"


class SameIdModel(ChatModel):
    """A broken model that gives every reply the same message id."""

    def __init__(self) -> None:
        self.turn = 0

    async def agenerate(self, messages: Any, tools: Any) -> Message:
        self.turn += 1
        if self.turn == 1:
            return Message.assistant(tool_calls=[ToolCallBlock("call_1", "lookup", {})], message_id="msg_fixed")
        return Message.assistant("done", message_id="msg_fixed")


def test_a_message_id_reused_for_a_different_message_is_an_error_never_a_silent_drop(
    checkpointer: BaseCheckpointer,
) -> None:
    """Before, the model's second reply was dropped as 'already stored' and the run ended without an answer."""

    def lookup() -> str:
        """Look something up."""
        return "found"

    app = ReactAgent(SameIdModel(), tools=[lookup]).compile(checkpointer)
    with pytest.raises(GraphBuildError, match=r"message id 'msg_fixed'.*already uses for a different message"):
        app.invoke({"messages": ["go"]}, {"thread_id": "t"})
    user = Message.user("refund 1042", message_id="req-1")
    done = refund_agent(checkpointer, []).invoke({"messages": [user]}, {"thread_id": "u"})
    again = refund_agent(checkpointer, []).invoke({"messages": [user]}, {"thread_id": "u"})  # a retry: no-op
    assert again.messages == done.messages
    with pytest.raises(ConfigError, match="message id 'req-1'"):
        refund_agent(checkpointer, []).invoke(
            {"messages": [Message.user("refund 9999", message_id="req-1")]}, {"thread_id": "u"}
        )
    stored = checkpointer.list_messages("u")
    assert [m.text for m in stored if m.role == "user"] == ["refund 1042"]  # nothing half-written


def test_one_input_that_repeats_a_message_id_adds_it_once_or_is_refused(checkpointer: BaseCheckpointer) -> None:
    same = Message.user("refund 1042", message_id="req-9")
    result = refund_agent(checkpointer, []).invoke({"messages": [same, same]}, {"thread_id": "dup"})
    assert [m.message_id for m in result.messages].count("req-9") == 1
    other = Message.user("refund 9999", message_id="req-10")
    clash = Message.user("something else", message_id="req-10")
    with pytest.raises(ConfigError, match="message id 'req-10'"):
        refund_agent(checkpointer, []).invoke({"messages": [other, clash]}, {"thread_id": "clash"})
    assert checkpointer.get_thread("clash") is None  # refused before anything was written
