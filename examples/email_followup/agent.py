"""Two user turns on one thread. The model calls its tool ``call_1`` on both turns, as some providers do: the
ledger key includes the assistant message id, so the second ``call_1`` is a new call, not a replay of the first."""

from __future__ import annotations

from typing import Any

from examples.payments import LocalProvider, Provider
from tenxgraph import CompiledGraph, ReactAgent, Reply, ScriptedModel
from tenxgraph.storage.checkpointer import BaseCheckpointer


def build_email_agent(
    checkpointer: BaseCheckpointer | None = None, provider: Provider | None = None
) -> CompiledGraph[Any]:
    mail = provider or LocalProvider()

    def send_email(to: str, body: str, idempotency_key: str) -> str:
        """Send an email."""
        return mail.apply("email", {"to": to, "body": body}, idempotency_key)["effect_id"]

    model = ScriptedModel(
        [
            Reply(
                tool_calls=[("send_email", {"to": "ada@example.com", "body": "Your refund is on its way."}, "call_1")]
            ),
            "Sent the refund email.",
            Reply(tool_calls=[("send_email", {"to": "ada@example.com", "body": "Did the refund arrive?"}, "call_1")]),
            "Sent the follow-up.",
        ]
    )
    return ReactAgent(model, tools=[send_email]).compile(checkpointer=checkpointer)
