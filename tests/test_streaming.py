"""stream(..., stream_mode=...): LangGraph's modes on our run loop. Tokens arrive while the model node runs, tool
results as they are recorded (marked replayed or fresh), and the ledger protects a streamed run as any other."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from tenxgraph import Message, ReactAgent, Resume, tool
from tenxgraph.core import crashpoints
from tenxgraph.core.crashpoints import CrashInjected
from tenxgraph.errors import ConfigError
from tenxgraph.models import MessageChunk, Reply, ScriptedModel
from tenxgraph.state.messages import JSON
from tenxgraph.storage.checkpointer.sqlite import SqliteCheckpointer

ran: list[str] = []


def refund_order(order_id: str) -> str:
    """Refund an order."""
    ran.append(f"refund {order_id}")
    return f"refunded {order_id}"


@tool(effect="read")  # a read: not recorded, it simply runs again on a resume
def lookup_order(order_id: str) -> str:
    """Look up an order."""
    ran.append(f"lookup {order_id}")
    return f"order {order_id}: 20 EUR"


SCRIPT = [
    Reply("Let me check and refund that.", [("lookup_order", {"order_id": "7"}), ("refund_order", {"order_id": "7"})]),
    "Order 7 is refunded.",
]


def agent(checkpointer: Any = None, model: Any = None) -> Any:
    return ReactAgent(model=model or ScriptedModel(SCRIPT), tools=[lookup_order, refund_order]).compile(checkpointer)


def test_messages_mode_streams_tokens_then_tool_results_as_recorded() -> None:
    ran.clear()
    items = list(agent().stream({"messages": ["refund 7"]}, {"thread_id": "s"}, stream_mode=["updates", "messages"]))
    chunks = [c for mode, (c, _) in (i for i in items if i[0] == "messages") if isinstance(c, MessageChunk)]
    first_id = chunks[0].message_id
    text = "".join(c.text for c in chunks if c.message_id == first_id)
    assert text == "Let me check and refund that."
    args: dict[int, str] = {}
    for c in chunks:
        if c.tool_call is not None and c.message_id == first_id:
            args[c.tool_call.index] = args.get(c.tool_call.index, "") + c.tool_call.args
    assert args == {0: '{"order_id": "7"}', 1: '{"order_id": "7"}'}
    modes = [(mode, type(chunk[0]).__name__ if mode == "messages" else next(iter(chunk))) for mode, chunk in items]
    tool_results = [i for i, m in enumerate(modes) if m == ("messages", "Message")]
    tool_update = modes.index(("updates", "TOOL"))
    assert len(tool_results) == 2 and max(tool_results) < tool_update  # results before the node's update
    assert modes.index(("updates", "MAIN")) < min(tool_results)
    for index in tool_results:
        message, metadata = items[index][1]
        assert message.role == "tool" and metadata["replayed"] is False and metadata["node"] == "TOOL"
    assert sorted(ran) == ["lookup 7", "refund 7"]


def test_a_resumed_stream_marks_recorded_calls_replayed(tmp_path: Any) -> None:
    """Crash after the refund's record; the resumed stream says its result came from the ledger, and the lookup's
    (a read, never recorded) from running again."""
    ran.clear()
    checkpointer = SqliteCheckpointer(str(tmp_path / "s.db"))
    app = agent(checkpointer)
    with crashpoints.armed("tool.after_record", hit=1), pytest.raises(CrashInjected):
        for _ in app.stream({"messages": ["refund 7"]}, {"thread_id": "c"}, stream_mode="messages"):
            pass
    first = list(ran)
    assert sorted(first) == ["lookup 7", "refund 7"]
    results = [
        (m.tool_results[0].call_id, meta["replayed"])
        for m, meta in agent(checkpointer).stream(None, {"thread_id": "c"}, stream_mode="messages")
        if isinstance(m, Message) and m.role == "tool"
    ]
    assert results == [("call_2", True), ("call_1", False)]  # the ledger answers first; the lookup runs again
    assert sorted(ran) == ["lookup 7", "lookup 7", "refund 7"]  # the refund did not run again
    state = app.get_state("c")
    assert state is not None and state.messages[-1].text == "Order 7 is refunded."


def test_single_mode_yields_chunks_list_yields_pairs_and_values_is_the_state() -> None:
    app = agent()
    values = list(app.stream({"messages": ["refund 7"]}, {"thread_id": "v"}, stream_mode="values"))
    assert all(isinstance(v, dict) for v in values) and len(values) == 3  # MAIN, TOOL, MAIN
    assert [m.text for m in values[-1]["messages"]][-1] == "Order 7 is refunded."
    assert values[-1]["messages"] == app.get_state("v").messages
    pairs = list(app.stream({"messages": ["again"]}, {"thread_id": "w"}, stream_mode=["result"]))
    assert [mode for mode, _ in pairs] == ["result"] and pairs[0][1].outcome == "completed"


def test_an_unknown_mode_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"stream_mode 'tokens' is not one of \['updates', 'values'"):
        list(agent().stream({"messages": ["x"]}, {"thread_id": "x"}, stream_mode="tokens"))


def test_a_caller_that_stops_reading_stops_the_run_between_nodes(tmp_path: Any) -> None:
    """Closing the stream does not abandon a call in flight (it would run again on resume): the node under way
    finishes, the run stops before the next one, and the thread is free and resumable."""
    for _ in range(5):  # wherever the close lands (the run goes on while the caller reads), nothing runs twice
        ran.clear()
        checkpointer = SqliteCheckpointer(str(tmp_path / f"s{_}.db"))
        app = agent(checkpointer)
        stream = app.stream({"messages": ["refund 7"]}, {"thread_id": "stop"}, stream_mode="messages")
        first, _meta = next(stream)
        assert isinstance(first, MessageChunk)
        stream.close()
        state = app.get_state("stop")
        assert state is not None and state.meta.status in ("running", "done")  # stopped at a node boundary
        result = app.invoke(None, {"thread_id": "stop", "lock_timeout": 5})  # free, and resumable
        assert result.final_text == "Order 7 is refunded." and ran.count("refund 7") == 1


class WholeModel:
    """A model that cannot stream: its reply reaches a "messages" stream whole, when its node ends."""

    async def agenerate(self, messages: Sequence[Message], tools: Sequence[dict[str, JSON]]) -> Message:
        return Message.assistant("whole reply")


def test_a_model_that_cannot_stream_is_streamed_whole() -> None:
    items = list(agent(model=WholeModel()).stream({"messages": ["hi"]}, {"thread_id": "whole"}, stream_mode="messages"))
    assert [(m.text, meta["node"]) for m, meta in items] == [("whole reply", "MAIN")]


def test_astream_modes_on_the_async_path() -> None:
    async def run() -> list[Any]:
        return [i async for i in agent().astream({"messages": ["q"]}, {"thread_id": "a"}, stream_mode="updates")]

    updates = asyncio.run(run())
    assert [next(iter(u)) for u in updates] == ["MAIN", "TOOL", "MAIN"]


def test_a_paused_run_streams_its_result_with_the_interrupts() -> None:
    @tool(approval=True)
    def wipe(order_id: str) -> str:
        """Wipe an order."""
        return "wiped"

    app = ReactAgent(model=ScriptedModel([Reply("", [("wipe", {"order_id": "1"})]), "done"]), tools=[wipe]).compile()
    (result,) = app.stream({"messages": ["wipe"]}, {"thread_id": "p"}, stream_mode="result")
    assert result.outcome == "interrupted" and len(result.interrupts) == 1
    resumed = [m for m, _ in app.stream(Resume({result.interrupts[0].id: True}), {"thread_id": "p"},
                                          stream_mode="messages") if isinstance(m, Message)]  # fmt: skip
    assert [m.tool_results[0].output for m in resumed if m.role == "tool"] == ["wiped"]
