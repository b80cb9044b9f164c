"""The fixed "refund" scenario, built with 10xgraph and (when installed) with LangGraph.

A run: user message -> assistant turn with 2 parallel tool calls -> tool results -> final assistant answer;
scripted model; a fresh thread per run.
"""

from __future__ import annotations

from typing import Any

from tenxgraph import Message, ReactAgent, Reply, ScriptedModel
from tenxgraph.storage.checkpointer import BaseCheckpointer

QUESTION = "refund order 1042"


def lookup_order(order_id: str) -> str:
    """Look up an order."""
    return f"order {order_id}: 20.00 EUR, delivered"


def refund_order(order_id: str) -> str:
    """Refund an order."""
    return f"refunded order {order_id}"


def tenxgraph_app(checkpointer: BaseCheckpointer) -> Any:
    model = ScriptedModel(
        [
            Reply(tool_calls=[("lookup_order", {"order_id": "1042"}), ("refund_order", {"order_id": "1042"})]),
            "Refunded 20.00 EUR on order 1042.",
        ]
    )
    return ReactAgent(model, tools=[lookup_order, refund_order]).compile(checkpointer=checkpointer)


def tenxgraph_input() -> dict[str, Any]:
    return {"messages": [Message.text_message(QUESTION)]}


def langgraph_app(saver: Any) -> Any:
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    tools = [tool(lookup_order), tool(refund_order)]

    def model(state: dict[str, Any]) -> dict[str, Any]:
        if not any(isinstance(m, AIMessage) for m in state["messages"]):
            calls = [
                {"name": "lookup_order", "args": {"order_id": "1042"}, "id": "call_1", "type": "tool_call"},
                {"name": "refund_order", "args": {"order_id": "1042"}, "id": "call_2", "type": "tool_call"},
            ]
            return {"messages": [AIMessage(content="", tool_calls=calls)]}
        return {"messages": [AIMessage(content="Refunded 20.00 EUR on order 1042.")]}

    from benchmarks.bench import langgraph_react

    return langgraph_react(saver, model, tools)


def langgraph_input() -> dict[str, Any]:
    from langchain_core.messages import HumanMessage

    return {"messages": [HumanMessage(QUESTION)]}
