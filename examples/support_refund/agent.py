"""The docs' support agent: look up an order, refund it, answer. Offline, with a ScriptedModel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tenxgraph import CompiledGraph, ReactAgent, Reply, ScriptedModel
from tenxgraph.storage.checkpointer import BaseCheckpointer

ORDERS = {"1042": {"order_id": "1042", "total": 20.0, "currency": "EUR", "status": "delivered"}}


def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order.

    Args:
        order_id: The order number.
    """
    order = ORDERS.get(order_id)
    if order is None:
        raise LookupError(f"no order {order_id}")
    return dict(order)


def make_refund_order(pay: Callable[[str, float], str]) -> Callable[[str, float], str]:
    """``refund_order`` moves money through *pay* (a payment API, or the test harness's simulator)."""

    def refund_order(order_id: str, amount: float) -> str:
        """Refund an amount on an order.

        Args:
            order_id: The order number.
            amount: The amount to refund, in the order's currency.
        """
        return f"Refunded {amount:.2f} on order {order_id} ({pay(order_id, amount)})"

    return refund_order


def script() -> ScriptedModel:
    return ScriptedModel(
        [
            Reply(tool_calls=[("lookup_order", {"order_id": "1042"})]),
            Reply(tool_calls=[("refund_order", {"order_id": "1042", "amount": 20.0})]),
            "Refunded 20.00 EUR on order 1042.",
        ]
    )


def build_support_agent(
    checkpointer: BaseCheckpointer | None = None, pay: Callable[[str, float], str] | None = None
) -> CompiledGraph[Any]:
    refund_order = make_refund_order(pay or (lambda order_id, amount: f"payment ref R-{order_id}"))
    agent = ReactAgent(
        script(),
        system_prompt="You are a support agent. Refund only delivered orders.",
        tools=[lookup_order, refund_order],
    )
    return agent.compile(checkpointer=checkpointer)
