"""A support agent whose refunds over a limit wait for a person's approval. Offline, with a ScriptedModel."""

from __future__ import annotations

from typing import Any

from examples.payments import LocalProvider, Provider
from tenxgraph import CompiledGraph, ReactAgent, Reply, ScriptedModel, tool
from tenxgraph.storage.checkpointer import BaseCheckpointer

#: Refunds above this amount wait for a person.
APPROVAL_LIMIT = 100.0


def make_refund_order(payments: Provider) -> Any:
    @tool(approval=lambda args: args["amount"] > APPROVAL_LIMIT)
    def refund_order(order_id: str, amount: float, idempotency_key: str) -> str:
        """Refund an amount on an order.

        Args:
            order_id: The order number.
            amount: The amount to refund, in the order's currency.
        """
        payment = payments.apply("refund", {"order": order_id, "amount": amount}, idempotency_key)
        return f"Refunded {amount:.2f} on order {order_id} (payment {payment['effect_id']})"

    return refund_order


def build_agent(
    checkpointer: BaseCheckpointer | None = None, payments: Provider | None = None, final: str | None = None
) -> CompiledGraph[Any]:
    """Two refunds asked for at once: 250.00 on order 1042 (over the limit: it waits for approval) and 30.00 on
    order 1043 (under it; it waits with its batch, then runs)."""
    model = ScriptedModel(
        [
            Reply(
                tool_calls=[
                    ("refund_order", {"order_id": "1042", "amount": 250.0}),
                    ("refund_order", {"order_id": "1043", "amount": 30.0}),
                ]
            ),
            final or "Refunded 250.00 EUR on order 1042 and 30.00 EUR on order 1043.",
        ]
    )
    agent: ReactAgent[Any] = ReactAgent(
        model,
        system_prompt="You are a support agent. Refunds over 100 EUR need a supervisor's approval.",
        tools=[make_refund_order(payments or LocalProvider())],
    )
    return agent.compile(checkpointer=checkpointer)
