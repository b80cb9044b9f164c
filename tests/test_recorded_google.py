"""provider="google" against recorded real Gemini traffic (pydantic-ai's cassettes, tests/recorded/README.md),
replayed through a local server into the official ``google-genai`` SDK. Where the cassette holds the follow-up
request the real API accepted, ours is compared with it."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest

from tenxgraph import Message, ReactAgent
from tenxgraph.models import resolve_model
from tenxgraph.models.stream import MessageChunk
from tenxgraph.state.messages import ToolResultBlock
from tenxgraph.utils.sync import run_sync
from tests.helpers import WireServer
from tests.replay import cassette, serve


@pytest.fixture
def wire() -> Iterator[WireServer]:
    server = WireServer()
    yield server
    server.httpd.shutdown()


def model(wire: WireServer, name: str = "gemini-3-pro-preview", **options: Any) -> Any:
    return resolve_model(f"google/{name}", api_key="test-key", base_url=wire.base, max_retries=0, **options)


def signature_bytes(text: str) -> bytes:
    """A signature as bytes, whichever base64 alphabet carried it (the API answers in one, the SDK sends the other)."""
    return base64.urlsafe_b64decode(text.replace("+", "-").replace("/", "_"))


def model_parts(request_body: dict[str, Any]) -> list[dict[str, Any]]:
    """The parts of the first model turn in a request body."""
    return next(c["parts"] for c in request_body["contents"] if c["role"] == "model")


def test_a_streamed_call_keeps_its_thought_signature_for_the_follow_up(wire: WireServer) -> None:
    """Gemini 3 rejects a follow-up whose function call lost its signature ("Function call is missing a
    thought_signature"): ours carries it on the same part, as the follow-up the real API accepted did."""
    first, second = cassette("test_google/test_google_streaming_tool_call_thought_signature")
    serve(wire, first["response"], second["response"])
    asked: list[str] = []

    def get_country() -> str:
        asked.append("country")
        return "Mexico"

    app = ReactAgent(model=model(wire, stream=True), tools=[get_country]).compile()
    result = app.invoke({"messages": ["What is the capital of the user country? Call the tool"]}, {"thread_id": "g"})
    assert asked == ["country"] and result.final_text == "The capital of Mexico is Mexico City."
    assert "streamGenerateContent" in wire.requests[0]["path"]
    ours, real = model_parts(wire.requests[1]["body"]), model_parts(second["request"])
    assert [list(p) for p in ours] == [list(p) for p in real] == [["functionCall", "thoughtSignature"]]
    assert signature_bytes(ours[0]["thoughtSignature"]) == signature_bytes(real[0]["thoughtSignature"])
    assert ours[0]["functionCall"]["name"] == "get_country"
    assert result.messages[1].metadata["usage"] == {"input_tokens": 29, "output_tokens": 10, "total_tokens": 241,
                                                    "reasoning_tokens": 202}  # fmt: skip


def test_parallel_calls_send_the_signature_back_on_the_first_part_only(wire: WireServer) -> None:
    turns = cassette("test_google/test_google_instructions_only_with_tool_calls")
    serve(wire, turns[0]["response"], turns[1]["response"])
    gemini = model(wire, "gemini-3-flash-preview")
    asked = [Message.user("Tell three jokes. Generate topics with the generate_topic tool.")]
    reply = run_sync(gemini.agenerate(asked, []))
    assert [c.id for c in reply.tool_calls] == ["call_1", "call_2", "call_3"]  # Gemini sends none: by position
    results = [
        Message.tool(ToolResultBlock(c.id, topic), metadata={"tool": c.name})
        for c, topic in zip(reply.tool_calls, ["cats", "dogs", "fish"], strict=True)
    ]
    run_sync(gemini.agenerate([*asked, reply, *results], []))
    ours, real = model_parts(wire.requests[1]["body"]), model_parts(turns[1]["request"])
    assert [sorted(p) for p in ours] == [sorted(p) for p in real]  # signature on the first of three parts only
    assert [("thoughtSignature" in p) for p in ours] == [True, False, False]
    assert signature_bytes(ours[0]["thoughtSignature"]) == signature_bytes(real[0]["thoughtSignature"])
    responses = next(c["parts"] for c in wire.requests[1]["body"]["contents"] if "functionResponse" in c["parts"][0])
    assert [p["functionResponse"]["id"] for p in responses] == ["call_1", "call_2", "call_3"]  # one content, paired


def test_thought_summaries_are_reasoning_not_the_answer(wire: WireServer) -> None:
    first, _ = cassette("test_google/test_google_model_thinking_part")
    serve(wire, first["response"], first["response"])
    app = ReactAgent(model=model(wire)).compile()
    result = app.invoke({"messages": ["How do I cross the street?"]}, {"thread_id": "think"})
    reasoning = result.messages[-1].metadata["reasoning"]
    assert isinstance(reasoning, str) and reasoning.startswith("**A Safe Street-Crossing Guide: My Thought Process**")
    assert "My Thought Process" not in result.final_text and len(result.final_text) > 200
    app.invoke({"messages": ["thanks"]}, {"thread_id": "think"})
    sent_back = model_parts(wire.requests[1]["body"])
    assert all("My Thought Process" not in p.get("text", "") for p in sent_back)  # never sent back as answer text
    assert any(p.get("text") == result.final_text for p in sent_back)


def test_thought_summaries_stream_as_reasoning_chunks(wire: WireServer) -> None:
    first, _ = cassette("test_google/test_google_model_thinking_part")
    serve(wire, first["response"])

    async def chunks() -> list[MessageChunk]:
        return [c async for c in model(wire).astream([Message.user("q")], []) if isinstance(c, MessageChunk)]

    # (the recorded non-streamed answer served as the stream's one event: what matters is the part split)
    wire.script[0] = (200, {"content-type": "text/event-stream"}, b"data: " + wire.script[0][2] + b"\r\n\r\n")  # type: ignore[operator]
    got = run_sync(chunks())
    assert got[0].reasoning.startswith("**A Safe Street-Crossing Guide") and got[0].text == ""
    assert any(c.text for c in got[1:]) and not any(c.reasoning for c in got[1:])


@pytest.mark.parametrize(
    ("name", "outcome", "reason", "said"),
    [
        ("test_google_model_max_tokens", "truncated", "length", "MAX_TOKENS"),
        ("test_google_model_safety_settings", "blocked", "content_filter", "SAFETY"),
        ("test_google_model_armor_prompt_template_text_gets_blocked", "blocked", "blocked", None),
    ],
)
def test_silent_endings_become_outcomes(
    wire: WireServer, name: str, outcome: str, reason: str, said: str | None
) -> None:
    (turn,) = cassette(f"test_google/{name}")
    serve(wire, turn["response"])
    result = (
        ReactAgent(model=model(wire, "gemini-2.5-flash")).compile().invoke({"messages": ["q"]}, {"thread_id": name})
    )
    assert result.status == "done" and result.outcome == outcome and result.finish_reason == reason
    metadata = result.messages[-1].metadata
    assert metadata.get("provider_finish_reason") == said
    if reason == "blocked":
        assert metadata["block_reason"] == "MODEL_ARMOR"
    if name.endswith("max_tokens"):
        assert result.final_text == "The capital of France is" and result.usage["output_tokens"] == 5
