"""provider="openai" against a local HTTP server that speaks the chat-completions wire format (never the internet)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tenxgraph import Message, ReactAgent
from tenxgraph.errors import ConfigError
from tenxgraph.models import resolve_model
from tests.helpers import WireServer, lookup_order, refund_order


def completion(content: str | None = None, calls: list[tuple[str, str, dict[str, Any]]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for cid, name, args in calls
        ]
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-test",
        "choices": [{"index": 0, "finish_reason": "tool_calls" if calls else "stop", "message": message}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


@pytest.fixture
def wire() -> Iterator[WireServer]:
    server = WireServer()
    yield server
    server.httpd.shutdown()


def agent(wire: WireServer) -> Any:
    return ReactAgent(
        model="openai/gpt-test",
        tools=[lookup_order, refund_order],
        system_prompt="You are support.",
        model_options={"base_url": wire.url, "api_key": "test-key", "max_retries": 2},
    ).compile()


def test_parallel_tool_calls_round_trip_with_provider_ids(wire: WireServer) -> None:
    wire.script = [
        (
            200,
            {},
            completion(
                calls=[
                    ("call_A", "lookup_order", {"order_id": "1042"}),
                    ("call_B", "refund_order", {"order_id": "1042", "amount": 20.0}),
                ]
            ),
        ),
        (200, {}, completion("Refunded 20.00 EUR on order 1042.")),
    ]
    result = agent(wire).invoke({"messages": [Message.text_message("refund order 1042")]}, {"thread_id": "t"})
    assert result.final_text == "Refunded 20.00 EUR on order 1042."
    assistant = result.messages[1]
    assert [c.id for c in assistant.tool_calls] == ["call_A", "call_B"]  # the provider's ids are the tool_call_ids
    assert assistant.message_id.startswith("msg_")  # ...and the message id is ours
    assert [r.output for m in result.messages[2:4] for r in m.tool_results] == [
        {"order_id": "1042", "total": 20.0},
        "refunded 20.0 on 1042",
    ]
    first, second = (r["body"] for r in wire.requests)
    assert first["model"] == "gpt-test" and first["messages"][0] == {"role": "system", "content": "You are support."}
    tool_names = [t["function"]["name"] for t in first["tools"]]
    assert tool_names == ["lookup_order", "refund_order"] and first["tools"][0]["type"] == "function"
    assert first["tools"][1]["function"]["parameters"]["required"] == ["order_id", "amount"]
    sent_back = second["messages"]
    assert [c["id"] for c in sent_back[2]["tool_calls"]] == ["call_A", "call_B"]
    assert sent_back[3] == {"role": "tool", "tool_call_id": "call_A", "content": '{"order_id": "1042", "total": 20.0}'}
    assert sent_back[4] == {"role": "tool", "tool_call_id": "call_B", "content": "refunded 20.0 on 1042"}


@pytest.mark.parametrize("status", [429, 500, 503])
def test_rate_limits_and_server_errors_are_retried(wire: WireServer, status: int) -> None:
    wire.script = [
        (status, {"retry-after": "0"}, {"error": {"message": "slow down", "type": "rate_limit"}}),
        (200, {}, completion("Done.")),
    ]
    result = agent(wire).invoke({"messages": ["hi"]}, {"thread_id": "t"})
    assert result.final_text == "Done." and len(wire.requests) == 2


def test_missing_api_key_is_a_clear_error_before_any_request(wire: WireServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="needs an API key: set OPENAI_API_KEY"):
        resolve_model("openai/gpt-test", base_url=wire.url)
    assert wire.requests == []
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    assert resolve_model("openai/gpt-test", base_url=wire.url) is not None  # the usual variable is read
