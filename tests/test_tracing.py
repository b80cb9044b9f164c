"""OpenTelemetry spans, read back with the SDK's in-memory exporter: a resumed run's trace says which calls the
ledger answered (``tenxgraph.tool.replayed``), and tracing costs nothing when no provider is configured."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tenxgraph import ReactAgent, tool
from tenxgraph.core import crashpoints
from tenxgraph.core.crashpoints import CrashInjected
from tenxgraph.core.tools.tracing import tracer_for
from tenxgraph.errors import ConfigError
from tenxgraph.models import Reply, ScriptedModel
from tenxgraph.storage.checkpointer.sqlite import SqliteCheckpointer
from tests.helpers import WireServer
from tests.replay import openai_capture, serve_sse


@pytest.fixture
def spans() -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter, provider
    provider.shutdown()


@tool(effect="read")
def lookup_order(order_id: str) -> str:
    """Look up an order."""
    return f"order {order_id}"


def refund_order(order_id: str) -> str:
    """Refund an order."""
    return f"refunded {order_id}"


def agent(checkpointer: Any) -> Any:
    script = [Reply("", [("lookup_order", {"order_id": "7"}), ("refund_order", {"order_id": "7"})]), "Refunded."]
    return ReactAgent(model=ScriptedModel(script), tools=[lookup_order, refund_order]).compile(checkpointer)


def named(found: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in found if s.name.startswith(prefix)]


def test_a_resumed_run_shows_which_calls_the_ledger_answered(tmp_path: Any, spans: Any) -> None:
    exporter, provider = spans
    checkpointer = SqliteCheckpointer(str(tmp_path / "t.db"))
    config = {"thread_id": "traced", "tracer_provider": provider}
    with crashpoints.armed("tool.after_record", hit=1), pytest.raises(CrashInjected):
        agent(checkpointer).invoke({"messages": ["refund 7"]}, config)
    crashed = exporter.get_finished_spans()
    (run,) = named(list(crashed), "invoke_agent")
    assert run.status.status_code.name == "ERROR" and run.attributes["tenxgraph.thread_id"] == "traced"
    exporter.clear()
    result = agent(checkpointer).invoke(None, config)
    assert result.final_text == "Refunded."
    found = list(exporter.get_finished_spans())
    tools = {s.attributes["gen_ai.tool.name"]: s for s in named(found, "execute_tool")}
    assert tools["refund_order"].attributes["tenxgraph.tool.replayed"] is True  # from the ledger: it did not run
    assert tools["lookup_order"].attributes["tenxgraph.tool.replayed"] is False  # a read: it ran again
    refund = tools["refund_order"].attributes
    assert refund["gen_ai.operation.name"] == "execute_tool" and refund["gen_ai.tool.call.id"] == "call_2"
    assert str(refund["tenxgraph.ledger.key"]).endswith(":call_2")
    assert tools["lookup_order"].attributes["tenxgraph.tool.effect"] == "read"
    (node,) = [s for s in named(found, "node TOOL")]
    assert node.attributes["tenxgraph.node.resumed"] is True
    assert all(s.parent is not None and s.parent.span_id == node.context.span_id for s in tools.values())
    (run,) = named(found, "invoke_agent")
    assert node.parent is not None and node.parent.span_id == run.context.span_id
    assert run.attributes["tenxgraph.run.outcome"] == "completed"
    assert {s.context.trace_id for s in found} == {run.context.trace_id}  # one trace per run


def test_model_spans_carry_the_genai_attributes(spans: Any) -> None:
    exporter, provider = spans
    wire = WireServer()
    try:
        serve_sse(wire, openai_capture("e2aad469b71d"))
        app = ReactAgent(
            model="openai/gpt-4o-2024-08-06",
            model_options={"base_url": wire.url, "api_key": "k", "max_retries": 0, "stream": True},
        ).compile()
        app.invoke({"messages": ["weather?"]}, {"thread_id": "m", "tracer_provider": provider})
    finally:
        wire.httpd.shutdown()
    (chat,) = named(list(exporter.get_finished_spans()), "chat ")
    assert chat.name == "chat gpt-4o-2024-08-06"
    attributes = dict(chat.attributes or {})
    assert attributes["gen_ai.provider.name"] == "openai" and attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.usage.input_tokens"] == 14 and attributes["gen_ai.usage.output_tokens"] == 30
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)


def test_in_doubt_calls_and_failed_records_are_span_events(tmp_path: Any, spans: Any) -> None:
    exporter, provider = spans

    @tool(on_in_doubt="retry")
    def charge(order_id: str) -> str:
        """Charge an order."""
        return "charged"

    def app(checkpointer: Any) -> Any:
        return ReactAgent(
            model=ScriptedModel([Reply("", [("charge", {"order_id": "1"})]), "ok"]), tools=[charge]
        ).compile(checkpointer)

    checkpointer = SqliteCheckpointer(str(tmp_path / "d.db"))
    config = {"thread_id": "doubt", "tracer_provider": provider}
    with crashpoints.armed("tool.after_return", hit=1), pytest.raises(CrashInjected):
        app(checkpointer).invoke({"messages": ["charge"]}, config)
    exporter.clear()
    with crashpoints.armed("ledger.write_error", hit=1):
        app(checkpointer).invoke(None, config)
    (call,) = named(list(exporter.get_finished_spans()), "execute_tool")
    assert [e.name for e in call.events] == ["tenxgraph.tool.in_doubt", "tenxgraph.ledger.write_failed"]
    assert call.attributes["tenxgraph.tool.recorded"] is False


def test_tracing_is_off_without_a_provider_and_a_bad_one_is_named() -> None:
    assert tracer_for(None) is None  # the API's default provider: nobody configured one, no spans are made
    with pytest.raises(ConfigError, match="must be an OpenTelemetry TracerProvider"):
        ReactAgent(model=ScriptedModel(["hi"])).compile().invoke(
            {"messages": ["hi"]}, {"thread_id": "bad", "tracer_provider": object()}
        )
