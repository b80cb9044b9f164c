from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from tenxgraph import AgentState, Message, TextBlock, ToolCallBlock, ToolResultBlock
from tenxgraph.errors import SerializationError
from tenxgraph.state import ExecutionMeta


def test_message_ids_are_generated_once_and_unique() -> None:
    a, b = Message.user("hi"), Message.user("hi")
    assert a.message_id != b.message_id
    assert a.message_id.startswith("msg_")


def test_message_round_trips_through_json_exactly() -> None:
    msg = Message(
        role="assistant",
        content=(
            TextBlock("Let me check ✓"),
            ToolCallBlock("call_1", "lookup_order", {"order_id": "1042", "nested": {"a": [1, 2.5, None]}}),
            ToolCallBlock("call_2", "raw", '{"x": 1'),
        ),
        metadata={"model": "scripted"},
    )
    again = Message.from_json(json.loads(json.dumps(msg.to_json())))
    assert again == msg
    assert again.message_id == msg.message_id
    assert again.tool_calls[1].args == '{"x": 1'  # raw provider text is kept, not "fixed"
    result = Message.tool(ToolResultBlock("call_1", {"total": 20}, is_error=True, status="error"))
    assert Message.from_dict(result.to_dict()) == result


def test_views_and_constructors() -> None:
    msg = Message.assistant("Refunded", [ToolCallBlock("c1", "refund", {})])
    assert msg.text == "Refunded" and [c.id for c in msg.tool_calls] == ["c1"]
    assert Message.text_message("x").role == "user"
    assert Message.system("be brief").role == "system"


def test_bad_role_and_bad_data_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="role 'robot'"):
        Message(role="robot")  # type: ignore[arg-type]
    with pytest.raises(SerializationError, match="message_id"):
        Message.from_dict({"role": "user", "content": []})
    with pytest.raises(SerializationError, match="unknown content block type 'image'"):
        Message.from_dict({"role": "user", "message_id": "m", "content": [{"type": "image"}]})


@dataclass
class SupportState(AgentState):
    refunded_total: float = 0.0
    tags: list[str] = field(default_factory=list)


def test_subclassed_state_round_trips() -> None:
    state = SupportState(
        messages=[Message.user("refund")],
        meta=ExecutionMeta(current_node="TOOL", step=3, status="running"),
        refunded_total=20.5,
        tags=["vip"],
    )
    again = SupportState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert again == state
    assert again.messages[0].message_id == state.messages[0].message_id


def test_state_with_undeclared_fields_is_rejected() -> None:
    with pytest.raises(SerializationError, match="does not declare"):
        AgentState.from_values({"refunded_total": 1}, [])
