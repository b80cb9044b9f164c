"""Finish reasons as each provider meant them (#50 item 2), through the official SDKs against a local server that
speaks their wire format: every documented Gemini ``finishReason`` mapped, an unknown one never a success; an
OpenAI-compatible server's parallel calls told apart by id (Ollama streams them all at ``index`` 0), and a gpt-oss
server's ``reasoning`` kept as reasoning."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tenxgraph import Message, ReactAgent
from tests.helpers import WireServer, lookup_order, refund_order

GO = {"messages": [Message.text_message("refund order 1042")]}


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> Iterator[WireServer]:
    for name in ("GOOGLE_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    server = WireServer()
    yield server
    server.httpd.shutdown()


def gemini(wire: WireServer) -> Any:
    options = {"api_key": "test-key", "base_url": wire.base, "max_retries": 0}
    return ReactAgent(model="google/gemini-test", provider="google", tools=[lookup_order], model_options=options)


@pytest.mark.parametrize(
    ("finish", "reason", "outcome"),
    [
        ("MODEL_ARMOR", "content_filter", "blocked"),  # blocked by Model Armor: no content at all
        ("IMAGE_PROHIBITED_CONTENT", "content_filter", "blocked"),
        ("TOO_MANY_TOOL_CALLS", "error", "unfinished"),
        ("MISSING_THOUGHT_SIGNATURE", "error", "unfinished"),
        ("UNEXPECTED_TOOL_CALL", "error", "unfinished"),
        ("OTHER", "other", "unfinished"),
        ("A_REASON_NOT_DOCUMENTED_YET", "other", "unfinished"),
    ],
)
@pytest.mark.filterwarnings("ignore:A_REASON_NOT_DOCUMENTED_YET is not a valid FinishReason")  # (the SDK's own)
def test_every_gemini_finish_reason_and_an_unknown_one_is_never_a_success(
    wire: WireServer, finish: str, reason: str, outcome: str
) -> None:
    candidate = {"finishReason": finish, "index": 0}
    wire.script = [(200, {}, {"candidates": [candidate], "usageMetadata": {"totalTokenCount": 1}})]
    result = gemini(wire).compile().invoke(GO, {"thread_id": "t"})
    assert (result.finish_reason, result.outcome) == (reason, outcome)
    assert result.messages[-1].metadata["provider_finish_reason"] == finish


def openai(wire: WireServer, stream: bool = False) -> Any:
    options = {"base_url": wire.url, "api_key": "test-key", "max_retries": 0, "stream": stream}
    return ReactAgent(model="openai/gpt-test", tools=[lookup_order, refund_order], model_options=options)


def sse(*chunks: dict[str, Any]) -> bytes:
    base = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 0, "model": "qwen3"}
    return b"".join(f"data: {json.dumps({**base, **c})}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def call(call_id: str, name: str, args: str) -> dict[str, Any]:
    piece = {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
    return {"choices": [{"index": 0, "delta": {"tool_calls": [piece]}, "finish_reason": None}]}


def test_parallel_calls_streamed_all_at_index_0_are_told_apart_by_id(wire: WireServer) -> None:
    """Ollama 0.20 (ollama/ollama#15457): two parallel calls, both ``index`` 0, each whole in one chunk."""
    first = sse(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        call("call_a", "lookup_order", '{"order_id": "1042"}'),
        call("call_b", "refund_order", '{"order_id": "1042", "amount": 20.0}'),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    )
    done = sse({"choices": [{"index": 0, "delta": {"content": "Refunded."}, "finish_reason": "stop"}]})
    stream = {"content-type": "text/event-stream"}
    wire.script = [(200, stream, first), (200, stream, done)]
    result = openai(wire, stream=True).compile().invoke(GO, {"thread_id": "t"})
    calls = result.messages[1].tool_calls
    assert [(c.id, c.name, json.loads(c.args) if isinstance(c.args, str) else c.args) for c in calls] == [
        ("call_a", "lookup_order", {"order_id": "1042"}),
        ("call_b", "refund_order", {"order_id": "1042", "amount": 20.0}),
    ]
    assert result.final_text == "Refunded." and result.outcome == "completed"


def test_a_gpt_oss_servers_reasoning_field_is_kept_as_reasoning(wire: WireServer) -> None:
    message = {"role": "assistant", "content": "Order 1042 is delivered.", "reasoning": "The user asks about 1042."}
    body = {
        "id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": "gpt-oss-20b",
        "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
    }  # fmt: skip
    wire.script = [(200, {}, body)]
    result = openai(wire).compile().invoke(GO, {"thread_id": "t"})
    assert result.final_text == "Order 1042 is delivered."
    assert result.messages[-1].metadata["reasoning"] == "The user asks about 1042."
