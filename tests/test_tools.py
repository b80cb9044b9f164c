"""ToolNode: schemas from signatures, and every bad-input path becomes an error result the model can act on."""

from __future__ import annotations

import asyncio
import threading
from typing import Literal

import pytest

from tenxgraph import Message, ReactAgent, Reply, ScriptedModel, Tool, ToolCallBlock, ToolOutput
from tenxgraph.core.graph import ToolNode
from tenxgraph.errors import GraphBuildError


def lookup_order(order_id: str, include_items: bool = False) -> dict[str, object]:
    """Look up an order by its number.

    Args:
        order_id: The order number, e.g. "1042".
        include_items: Whether to list the items
            of the order too.

    Returns:
        The order.
    """
    return {"order_id": order_id, "items": ["mug"] if include_items else []}


async def refund(order_id: str, amount: float, reason: Literal["damaged", "late"] = "late") -> str:
    """Refund money on an order."""
    return f"refunded {amount:.2f} on {order_id} ({reason})"


def test_schema_comes_from_signature_hints_and_docstring() -> None:
    schema = Tool.from_function(lookup_order).schema()
    assert schema["name"] == "lookup_order"
    assert schema["description"] == "Look up an order by its number."
    params = schema["parameters"]
    assert params["required"] == ["order_id"]
    assert params["properties"]["order_id"] == {
        "type": "string",
        "description": 'The order number, e.g. "1042".',
    }
    assert params["properties"]["include_items"] == {
        "type": "boolean",
        "description": "Whether to list the items of the order too.",
        "default": False,
    }
    assert params["additionalProperties"] is False
    refund_params = Tool.from_function(refund).schema()["parameters"]
    assert refund_params["properties"]["amount"] == {"type": "number"}
    assert refund_params["properties"]["reason"]["enum"] == ["damaged", "late"]
    assert Tool.from_function(refund).is_async and not Tool.from_function(lookup_order).is_async


def test_undescribable_tools_are_rejected_when_defined() -> None:
    def star(*args: int) -> None: ...

    def weird(x: object) -> None: ...

    with pytest.raises(TypeError, match=r"\*args/\*\*kwargs"):
        Tool.from_function(star)
    with pytest.raises(TypeError, match="parameter 'x'"):
        Tool.from_function(weird)
    with pytest.raises(GraphBuildError, match="two tools are named"):
        ToolNode([lookup_order, lookup_order])


def run_calls(*calls: ToolCallBlock, tools: list[object] | None = None, config: dict[str, object] | None = None):  # type: ignore[no-untyped-def]
    """Run one assistant turn with *calls* through a ReactAgent and return the tool results."""
    model = ScriptedModel([Message.assistant("", list(calls)), "done"])
    agent = ReactAgent(model, tools=tools if tools is not None else [lookup_order, refund])  # type: ignore[arg-type]
    result = agent.compile().invoke({"messages": ["go"]}, {"thread_id": "t", **(config or {})})
    assert result.final_text == "done"  # the run went on after every error
    return [m.tool_results[0] for m in result.messages if m.role == "tool"]


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (ToolCallBlock("c", "lookup_order", '{"order_id": '), "not valid JSON"),
        (ToolCallBlock("c", "lookup_order", "[1, 2]"), "must be a JSON object"),
        (ToolCallBlock("c", "lookup_order", {}), "missing required argument(s) order_id"),
        (ToolCallBlock("c", "lookup_order", {"order_id": "1", "color": "red"}), "unknown argument(s) color"),
        (
            ToolCallBlock("c", "lookup_order", {"order_id": 1042}),
            "argument order_id should be string, got 1042",
        ),
        (ToolCallBlock("c", "refund", {"order_id": "1", "amount": 1, "reason": "bored"}), "reason should be"),
        (
            ToolCallBlock("c", "delete_everything", {}),
            "unknown tool 'delete_everything'; available tools: lookup_",
        ),
    ],
)
def test_bad_calls_become_error_results(call: ToolCallBlock, expected: str) -> None:
    [result] = run_calls(call)
    assert result.is_error and result.status == "error"
    assert expected in result.output
    assert result.call_id == "c"


def test_raw_json_arguments_are_decoded() -> None:
    [result] = run_calls(ToolCallBlock("c", "lookup_order", '{"order_id": "7", "include_items": true}'))
    assert not result.is_error and result.output == {"order_id": "7", "items": ["mug"]}


def test_a_tool_that_raises_gives_an_error_result() -> None:
    def explode(order_id: str) -> str:
        raise LookupError(f"order {order_id} not found")

    [result] = run_calls(ToolCallBlock("c", "explode", {"order_id": "9"}), tools=[explode])
    assert result.is_error and result.output == "LookupError: order 9 not found"


def test_tool_timeout_cancels_the_call_with_an_error_result() -> None:
    cancelled = asyncio.Event()

    async def hang() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    [result] = run_calls(ToolCallBlock("c", "hang", {}), tools=[hang], config={"tool_timeout": 0.05})
    assert result.is_error and result.status == "timeout"
    assert result.output.startswith("ToolTimeoutError: tool 'hang' did not finish within tool_timeout=0.05s")
    assert cancelled.is_set()


def test_sync_tools_run_off_the_event_loop_and_async_tools_on_it() -> None:
    where: dict[str, str] = {}

    def sync_tool() -> str:
        where["sync"] = threading.current_thread().name
        return "s"

    async def async_tool() -> str:
        where["async"] = threading.current_thread().name
        return "a"

    results = run_calls(
        ToolCallBlock("c1", "sync_tool", {}),
        ToolCallBlock("c2", "async_tool", {}),
        tools=[sync_tool, async_tool],
    )
    assert [r.output for r in results] == ["s", "a"]
    # the sync wrapper runs its loop in the caller when free, else the thread running it (its helper) does
    assert where["async"] in (threading.current_thread().name, "tenxgraph-sync")
    assert where["sync"] != where["async"]


def test_tool_output_updates_state() -> None:
    from dataclasses import dataclass

    from tenxgraph import AgentState

    @dataclass
    class S(AgentState):
        refunded: float = 0.0

    def pay(amount: float) -> ToolOutput:
        return ToolOutput(f"paid {amount}", update={"refunded": amount})

    model = ScriptedModel([Reply(tool_calls=[("pay", {"amount": 12.5})]), "ok"])
    result = ReactAgent(model, tools=[pay], state_schema=S).compile().invoke({"messages": ["x"]}, {"thread_id": "t"})
    assert result.state.refunded == 12.5
    assert result.messages[2].tool_results[0].output == "paid 12.5"


def test_what_watches_the_runtime_is_one_installed_instrument() -> None:
    """The seam: one :class:`Instrument` sees the structured events and the tool events of a run, the first one
    installed with a completion order decides the order, and removing it stops all of it."""
    from tenxgraph.core.graph.utils.instrument import ToolEvent
    from tenxgraph.utils.instrument import Instrument, completion_order, install

    events: list[str] = []
    tools: list[tuple[str, int]] = []
    asked: list[list[int]] = []

    def order(batch: list) -> list[int]:  # type: ignore[type-arg]
        asked.append([info.index for info in batch])
        return [1, 0]

    def pay(amount: float) -> str:
        return f"paid {amount}"

    def run(thread: str) -> None:  # crashed after the first record, then resumed: a replay, and its events
        from tenxgraph.core import crashpoints

        model = ScriptedModel([Reply(tool_calls=[("pay", {"amount": 1.0}), ("pay", {"amount": 2.0})]), "ok"])
        app = ReactAgent(model, tools=[pay]).compile()
        with crashpoints.armed("tool.after_record", 1), pytest.raises(crashpoints.CrashInjected):
            app.invoke({"messages": [Message.text_message("go")]}, {"thread_id": thread})
        app.invoke(None, {"thread_id": thread})

    def on_tool(event: ToolEvent) -> None:
        tools.append((event.kind, event.call.index))

    remove = install(Instrument(on_event=lambda name, fields: events.append(name), on_tool=on_tool))
    remove_order = install(Instrument(completion_order=order))
    second = install(Instrument(completion_order=lambda batch: [0, 1]))
    try:
        assert completion_order() is order  # the first installed with one decides
        run("seen")
    finally:
        remove(), remove_order(), second()
    assert asked == [[0, 1]]  # (the resume runs call 0 alone: no order to ask for)
    recorded = [index for kind, index in tools if kind == "recorded"]
    assert recorded == [1, 0]  # call 1 first, as the order said: the crash left it recorded, and call 0 ran again
    assert {"run_resumed", "tool_replayed"} <= set(events), events  # the run's structured events reached it
    before = (len(events), len(tools), len(asked))
    run("unseen")
    assert (len(events), len(tools), len(asked)) == before and completion_order() is None
