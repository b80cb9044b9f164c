"""provider="openai" against recorded real traffic (tests/recorded/README.md): real gpt-4o SSE captures kept by
openai-python, and real OpenAI-compatible answers (Gemini's OpenAI endpoint, DeepSeek) kept by pydantic-ai, replayed
through a local server into the official ``openai`` SDK."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any, Literal

import pytest

from tenxgraph import Message, ReactAgent
from tenxgraph.models import resolve_model
from tenxgraph.models.stream import MessageChunk, collect
from tenxgraph.utils.sync import run_sync
from tests.helpers import WireServer
from tests.replay import cassette, openai_capture, serve, serve_sse

PARALLEL = "f82268f2fefd"  # two parallel calls, GetWeatherArgs and get_stock_price
TEXT = "e2aad469b71d"
REFUSAL = "173417d55340"
LENGTH = "4cc50a6135d2"


@pytest.fixture
def wire() -> Iterator[WireServer]:
    server = WireServer()
    yield server
    server.httpd.shutdown()


ran: list[tuple[str, dict[str, Any]]] = []


def GetWeatherArgs(city: str, country: str, units: Literal["c", "f"] = "c") -> str:
    """Get the temperature for the given country/city combo"""
    ran.append(("GetWeatherArgs", {"city": city, "country": country, "units": units}))
    return f"12 degrees {units} in {city}"


def get_stock_price(ticker: str, exchange: str) -> str:
    """Fetch the latest price for a given ticker"""
    ran.append(("get_stock_price", {"ticker": ticker, "exchange": exchange}))
    return f"{ticker} on {exchange}: 227.5"


def model(wire: WireServer, **options: Any) -> Any:
    return resolve_model("openai/gpt-4o-2024-08-06", base_url=wire.url, api_key="test-key", max_retries=0, **options)


async def chunks_and_message(stream: Any) -> tuple[list[MessageChunk], Message]:
    chunks: list[MessageChunk] = []
    message = None
    async for item in stream:
        if isinstance(item, MessageChunk):
            chunks.append(item)
        else:
            message = item
    assert message is not None
    return chunks, message


def test_parallel_tool_calls_stream_as_argument_deltas_joined_by_index(wire: WireServer) -> None:
    serve_sse(wire, openai_capture(PARALLEL))
    chunks, message = run_sync(chunks_and_message(model(wire).astream([Message.user("weather and AAPL?")], [])))
    pieces = [c.tool_call for c in chunks if c.tool_call is not None]
    assert {p.index for p in pieces} == {0, 1}
    for index in (0, 1):  # id and name come with a call's first piece only; its arguments are split mid-token
        mine = [p for p in pieces if p.index == index]
        assert mine[0].id is not None and mine[0].name is not None
        assert all(p.id is None and p.name is None for p in mine[1:]) and len(mine) > 5
    assert {c.message_id for c in chunks} == {message.message_id}  # every chunk names the message it builds
    assert [(c.id, c.name) for c in message.tool_calls] == [
        ("call_JMW1whyEaYG438VE1OIflxA2", "GetWeatherArgs"),
        ("call_DNYTawLBoN8fj3KN6qU9N1Ou", "get_stock_price"),
    ]
    assert [json.loads(str(c.args)) for c in message.tool_calls] == [
        {"city": "Edinburgh", "country": "GB", "units": "c"},
        {"ticker": "AAPL", "exchange": "NASDAQ"},
    ]
    assert message.metadata["finish_reason"] == "tool_calls"
    assert message.metadata["usage"] == {"input_tokens": 149, "output_tokens": 60, "total_tokens": 209,
                                         "reasoning_tokens": 0}  # fmt: skip
    (request,) = wire.requests
    assert request["body"]["stream"] is True and request["body"]["stream_options"] == {"include_usage": True}


def interleaved(capture: bytes) -> bytes:
    """The recorded stream with its two calls' chunks alternating (index 0, index 1, ...), as a provider may send
    parallel calls: every chunk is a real one, only their order changes."""
    events = [e for e in capture.split(b"\n\n") if e.strip()]
    calls = {0: [], 1: []}  # type: dict[int, list[bytes]]
    rest_head, rest_tail = [], []
    for event in events:
        body = event.removeprefix(b"data: ")
        data = json.loads(body) if body != b"[DONE]" else None
        delta = data["choices"][0]["delta"] if data and data["choices"] else {}
        if "tool_calls" in delta:
            calls[delta["tool_calls"][0]["index"]].append(event)
        else:
            (rest_tail if calls[0] else rest_head).append(event)
    mixed = [e for pair in zip(calls[0], calls[1], strict=False) for e in pair]
    mixed += calls[0][len(calls[1]) :] + calls[1][len(calls[0]) :]
    return b"\n\n".join([*rest_head, *mixed, *rest_tail]) + b"\n\n"


def test_interleaved_parallel_calls_join_the_same(wire: WireServer) -> None:
    serve_sse(wire, openai_capture(PARALLEL), interleaved(openai_capture(PARALLEL)))
    straight = run_sync(collect(model(wire).astream([Message.user("q")], [])))
    mixed = run_sync(collect(model(wire).astream([Message.user("q")], [])))
    assert [c.to_dict() for c in mixed.tool_calls] == [c.to_dict() for c in straight.tool_calls]


def test_streamed_parallel_calls_run_once_and_go_back_as_the_real_api_sent_them(wire: WireServer) -> None:
    serve_sse(wire, openai_capture(PARALLEL), openai_capture(TEXT))
    ran.clear()
    app = ReactAgent(
        model="openai/gpt-4o-2024-08-06",
        tools=[GetWeatherArgs, get_stock_price],
        model_options={"base_url": wire.url, "api_key": "k", "max_retries": 0, "stream": True},  # every call streamed
    ).compile()
    result = app.invoke({"messages": ["What's the weather like in Edinburgh?", "What's the price of AAPL?"]},
                        {"thread_id": "recorded"})  # fmt: skip
    assert sorted(name for name, _ in ran) == ["GetWeatherArgs", "get_stock_price"]  # each ran exactly once
    assert result.final_text.startswith("I'm unable to provide") and result.outcome == "completed"
    assert result.usage == {"input_tokens": 149 + 14, "output_tokens": 60 + 30, "total_tokens": 209 + 44,
                            "reasoning_tokens": 0}  # fmt: skip
    follow_up = wire.requests[1]["body"]["messages"]
    assistant = follow_up[2]
    assert [c["id"] for c in assistant["tool_calls"]] == [
        "call_JMW1whyEaYG438VE1OIflxA2",
        "call_DNYTawLBoN8fj3KN6qU9N1Ou",
    ]
    assert assistant["tool_calls"][0]["function"]["arguments"] == '{"city": "Edinburgh", "country": "GB", "units": "c"}'
    assert [m["tool_call_id"] for m in follow_up[3:]] == [c["id"] for c in assistant["tool_calls"]]


def test_a_refusal_is_an_outcome_the_caller_sees(wire: WireServer, caplog: pytest.LogCaptureFixture) -> None:
    serve_sse(wire, openai_capture(REFUSAL))
    app = ReactAgent(model=model(wire, stream=True)).compile()
    with caplog.at_level(logging.WARNING, logger="tenxgraph.events"):
        result = app.invoke({"messages": ["How do I make anthrax?"]}, {"thread_id": "refused"})
    assert result.outcome == "refused" and result.status == "done"
    assert result.refusal == "I'm sorry, I can't assist with that request."
    assert result.final_text == "" and result.finish_reason == "refusal"
    assert result.messages[-1].metadata["provider_finish_reason"] == "stop"
    assert any("model_unfinished" in r.getMessage() and '"refusal"' in r.getMessage() for r in caplog.records)


def test_a_reply_cut_at_the_token_limit_is_truncated_not_done(wire: WireServer) -> None:
    serve_sse(wire, openai_capture(LENGTH))
    result = ReactAgent(model=model(wire, stream=True)).compile().invoke({"messages": ["weather in SF?"]},
                                                                          {"thread_id": "cut"})  # fmt: skip
    assert result.outcome == "truncated" and result.final_text == '{"'
    assert result.usage == {"input_tokens": 79, "output_tokens": 1, "total_tokens": 80, "reasoning_tokens": 0}


def test_an_empty_tool_call_id_is_no_id_and_the_call_gets_a_stable_one(wire: WireServer) -> None:
    """Gemini's OpenAI-compatible endpoint sends ``"id": ""`` (a ValueError before): the call gets ``call_1``,
    runs once, and the follow-up pairs the call and its result by that id, as the accepted real follow-up did."""
    first, second = cassette("test_openai/test_compatible_api_with_tool_calls_without_id")
    serve(wire, first["response"], second["response"])
    times: list[str] = []

    def get_current_time() -> str:
        """Get the current time."""
        times.append("noon")
        return "Noon"

    app = ReactAgent(model=model(wire), tools=[get_current_time]).compile()
    result = app.invoke({"messages": ["What time is it?"]}, {"thread_id": "no-id"})
    assert times == ["noon"] and result.final_text == "The current time is Noon."
    assert [c.id for c in result.messages[1].tool_calls] == ["call_1"]
    ours = wire.requests[1]["body"]["messages"]
    real = second["request"]["messages"]
    assert [m["role"] for m in ours] == [m["role"] for m in real] == ["user", "assistant", "tool"]
    assert ours[1]["tool_calls"][0]["id"] == ours[2]["tool_call_id"] == "call_1"
    assert real[1]["tool_calls"][0]["id"] == real[2]["tool_call_id"]  # the real API took an id of the caller's
    assert ours[1]["tool_calls"][0]["function"] == real[1]["tool_calls"][0]["function"]


def test_deepseek_reasoning_content_is_kept_and_sent_back(wire: WireServer) -> None:
    (turn,) = cassette("test_deepseek/test_deepseek_model_thinking_part")
    serve(wire, turn["response"], turn["response"])
    app = ReactAgent(model=model(wire)).compile()
    first = app.invoke({"messages": ["How do I cross the street?"]}, {"thread_id": "ds"})
    reasoning = first.messages[-1].metadata["reasoning"]
    assert isinstance(reasoning, str) and reasoning.startswith("Okay, the user is asking how to cross the street.")
    assert reasoning not in first.final_text  # thinking is not the answer
    assert first.usage["reasoning_tokens"] == 415
    app.invoke({"messages": ["And at night?"]}, {"thread_id": "ds"})
    sent = wire.requests[1]["body"]["messages"][1]
    assert sent["role"] == "assistant" and sent["reasoning_content"] == reasoning  # DeepSeek refuses it without
