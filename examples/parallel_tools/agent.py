"""One assistant turn asks for three tools at once: refund, email, ticket. They run concurrently and each is
recorded the moment it returns, so after a crash the finished ones are replayed and only the rest run."""

from __future__ import annotations

import asyncio
from typing import Any

from examples.payments import LocalProvider, Provider
from tenxgraph import CompiledGraph, ReactAgent, Reply, ScriptedModel
from tenxgraph.storage.checkpointer import BaseCheckpointer


def make_tools(provider: Provider, email_delay: float) -> list[Any]:
    async def refund_order(order_id: str, amount: float, idempotency_key: str) -> str:
        """Refund an amount on an order."""
        return provider.apply("refund", {"order": order_id, "amount": amount}, idempotency_key)["effect_id"]

    async def send_email(to: str, subject: str, idempotency_key: str) -> str:
        """Send an email."""
        await asyncio.sleep(email_delay)  # the slowest of the three
        return provider.apply("email", {"to": to, "subject": subject}, idempotency_key)["effect_id"]

    def open_ticket(title: str, idempotency_key: str) -> str:
        """Open a support ticket."""
        return provider.apply("ticket", {"title": title}, idempotency_key)["effect_id"]

    return [refund_order, send_email, open_ticket]


def build_parallel_agent(
    checkpointer: BaseCheckpointer | None = None, provider: Provider | None = None, email_delay: float = 0.001
) -> CompiledGraph[Any]:
    model = ScriptedModel(
        [
            Reply(
                tool_calls=[
                    ("refund_order", {"order_id": "1042", "amount": 20.0}),
                    ("send_email", {"to": "ada@example.com", "subject": "Your refund"}),
                    ("open_ticket", {"title": "Refund 1042 follow-up"}),
                ]
            ),
            "Refunded, emailed, and opened a ticket.",
        ]
    )
    return ReactAgent(model, tools=make_tools(provider or LocalProvider(), email_delay)).compile(
        checkpointer=checkpointer
    )
