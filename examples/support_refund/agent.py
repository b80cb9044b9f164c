"""The docs' support agent: look up an order, refund it (money moves), answer. Offline, with a ScriptedModel."""

from __future__ import annotations

from typing import Any

from examples.payments import LocalProvider, Provider
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


def make_refund_order(payments: Provider) -> Any:
    def refund_order(order_id: str, amount: float, idempotency_key: str) -> str:
        """Refund an amount on an order.

        Args:
            order_id: The order number.
            amount: The amount to refund, in the order's currency.
        """
        # idempotency_key is injected by the runtime (the model never sees it) and is the same if this call is
        # replayed or re-run after a crash: the provider refunds once.
        payment = payments.apply("refund", {"order": order_id, "amount": amount}, idempotency_key)
        return f"Refunded {amount:.2f} on order {order_id} (payment {payment['effect_id']})"

    return refund_order


def build_support_agent(
    checkpointer: BaseCheckpointer | None = None, payments: Provider | None = None, mistyped: str | None = None
) -> CompiledGraph[Any]:
    """*mistyped*: the model first looks up this order number, which does not exist (the lookup fails, and its
    failure is recorded and replayed like any result), then the right one."""
    first = [Reply(tool_calls=[("lookup_order", {"order_id": mistyped})])] if mistyped else []
    model = ScriptedModel(
        [
            *first,
            Reply(tool_calls=[("lookup_order", {"order_id": "1042"})]),
            Reply(tool_calls=[("refund_order", {"order_id": "1042", "amount": 20.0})]),
            "Refunded 20.00 EUR on order 1042.",
        ]
    )
    agent: ReactAgent[Any] = ReactAgent(
        model,
        system_prompt="You are a support agent. Refund only delivered orders.",
        tools=[lookup_order, make_refund_order(payments or LocalProvider())],
    )
    return agent.compile(checkpointer=checkpointer)
