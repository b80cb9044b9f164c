"""provider="google" against a local HTTP server that speaks the generateContent wire format."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tenxgraph import Message, ReactAgent
from tenxgraph.errors import ConfigError
from tests.helpers import WireServer, lookup_order, refund_order


def reply(text: str | None = None, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"text": text}] if text else []
    parts += [{"functionCall": call} for call in calls or []]
    return {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2},
    }


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> Iterator[WireServer]:
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    server = WireServer()
    yield server
    server.httpd.shutdown()


def agent(wire: WireServer) -> Any:
    return ReactAgent(
        model="google/gemini-test",
        provider="google",
        tools=[lookup_order, refund_order],
        system_prompt="You are support.",
        model_options={"api_key": "test-key", "base_url": wire.base, "max_retries": 2},
    ).compile()


def test_parallel_function_calls_round_trip(wire: WireServer) -> None:
    wire.script = [
        (
            200,
            {},
            reply(
                calls=[
                    {"id": "fc_A", "name": "lookup_order", "args": {"order_id": "1042"}},
                    {"name": "refund_order", "args": {"order_id": "1042", "amount": 20.0}},
                ]
            ),
        ),
        (200, {}, reply("Refunded 20.00 EUR on order 1042.")),
    ]
    result = agent(wire).invoke({"messages": [Message.text_message("refund order 1042")]}, {"thread_id": "t"})
    assert result.final_text == "Refunded 20.00 EUR on order 1042."
    assistant = result.messages[1]
    assert [c.id for c in assistant.tool_calls] == ["fc_A", "call_2"]  # provider id kept; a missing one made stable
    assert assistant.message_id.startswith("msg_")
    first, second = (r["body"] for r in wire.requests)
    assert "/models/gemini-test:generateContent" in wire.requests[0]["path"]
    assert first["systemInstruction"]["parts"][0]["text"] == "You are support."
    declarations = first["tools"][0]["functionDeclarations"]
    assert [d["name"] for d in declarations] == ["lookup_order", "refund_order"]
    schema = declarations[1].get("parametersJsonSchema") or declarations[1].get("parameters_json_schema")
    assert schema["required"] == ["order_id", "amount"]  # (the SDK picks the field's spelling)
    model_turn, results_turn = second["contents"][1], second["contents"][2]
    assert model_turn["role"] == "model" and model_turn["parts"][0]["functionCall"]["id"] == "fc_A"
    responses = [p["functionResponse"] for p in results_turn["parts"]]
    assert responses[0] == {
        "id": "fc_A",
        "name": "lookup_order",
        "response": {"output": {"order_id": "1042", "total": 20.0}},
    }
    assert responses[1]["id"] == "call_2" and responses[1]["response"] == {"output": "refunded 20.0 on 1042"}


@pytest.mark.parametrize("status", [429, 503])
def test_retries_honour_retry_after(wire: WireServer, status: int) -> None:
    wire.script = [
        (status, {"retry-after": "0"}, {"error": {"code": status, "message": "slow down", "status": "UNAVAILABLE"}}),
        (200, {}, reply("Done.")),
    ]
    assert agent(wire).invoke({"messages": ["hi"]}, {"thread_id": "t"}).final_text == "Done."
    assert len(wire.requests) == 2


def test_retry_delay_prefers_retry_after() -> None:
    from tenxgraph.models.google import retry_delay

    class Exc(Exception):
        def __init__(self, headers: dict[str, str]) -> None:
            self.response = type("R", (), {"headers": headers})()

    assert retry_delay(Exc({"retry-after": "7"}), 0) == 7.0
    assert retry_delay(Exc({}), 3) == 4.0 and retry_delay(Exc({}), 10) == 8.0  # backoff, capped


def test_missing_api_key_is_a_clear_error_before_any_request(wire: WireServer, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="needs an API key: set GOOGLE_API_KEY or GEMINI_API_KEY"):
        ReactAgent(model="google/gemini-test", model_options={"base_url": wire.base})
    assert wire.requests == []
    monkeypatch.setenv("GEMINI_API_KEY", "from-env")
    assert ReactAgent(model="google/gemini-test", model_options={"base_url": wire.base}).model is not None
