"""A support agent whose refunds over a limit wait for a person's approval. Offline, with a ScriptedModel."""

from __future__ import annotations

from typing import Any

from examples.payments import LocalProvider, Provider
from examples.support_refund.agent import make_refund_order as refund_with
from tenxgraph import CompiledGraph, ReactAgent, Reply, ScriptedModel, tool
from tenxgraph.storage.checkpointer import BaseCheckpointer

#: Refunds above this amount wait for a person.
APPROVAL_LIMIT = 100.0


def make_refund_order(payments: Provider) -> Any:
    """support_refund's refund tool (it passes its idempotency key to the provider), over the limit only with a
    person's approval."""
    return tool(approval=lambda args: args["amount"] > APPROVAL_LIMIT)(refund_with(payments))


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
