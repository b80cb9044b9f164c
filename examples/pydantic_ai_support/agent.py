"""A support agent as Pydantic AI's docs write one: ``Agent(model, name=..., instructions=...)`` with tools
registered by ``@agent.tool_plain``. Its first turn asks for two tools at once (a refund and an email), its second
for a receipt, its third answers. The model is Pydantic AI's own ``FunctionModel`` answering from the conversation
so far, as a scripted model would (no API key, the same reply in every process; streamed too).

``build_agent(provider)`` is the bare agent; ``build_agent(provider, ledger=checkpointer)`` the same agent with
``LedgerDurability``: its model turns journaled and its tool calls recorded in the ledger as they return, so a run
resumed with its ``run_id`` after a crash neither asks the model again nor runs a finished call again. The tools
pass the provider the call's idempotency key (``current_idempotency_key()``: None on the bare agent).

``python -m examples.pydantic_ai_support.agent EFFECTS_DB LEDGER RUN_ID [CRASH_IN]`` runs it once in a process of
its own, on a SQLite file or a PostgreSQL DSN (``postgresql://...#schema``); with *CRASH_IN* (a tool's name) the
process dies (``os._exit``) right after that tool's effect, before the tool returns: the crash a resume must not
turn into a second effect."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from examples.payments import Provider
from tenxgraph.integrations.pydantic_ai import LedgerDurability, current_idempotency_key, current_transaction
from tenxgraph.ledger import LedgerStore

FINAL = "Refunded order A-1042, emailed the customer and sent the receipt."
#: How many messages each request to the model carried, in this process.
ASKED: list[int] = []


def support_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The model's turn, from the tool results it has seen so far (a failed call counts as answered: the model
    moves on and tells the customer)."""
    ASKED.append(len(messages))
    returned = {p.tool_name for m in messages if isinstance(m, ModelRequest) for p in m.parts
                if isinstance(p, ToolReturnPart | RetryPromptPart)}  # fmt: skip
    if not returned:
        return ModelResponse(
            parts=[
                ToolCallPart("refund", {"order": "A-1042", "amount": 20.0}),
                ToolCallPart("email", {"to": "ada@example.com", "text": "Your refund is on its way."}),
            ]
        )
    if "receipt" not in returned:
        return ModelResponse(parts=[ToolCallPart("receipt", {"order": "A-1042"})])
    return ModelResponse(parts=[TextPart(FINAL)])


async def support_stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
    """The same turn, streamed (``run_stream``): its text, or its tool calls, as chunks."""
    response = support_model(messages, info)
    calls: DeltaToolCalls = {}
    for index, part in enumerate(response.parts):
        if isinstance(part, TextPart):
            yield part.content
        elif isinstance(part, ToolCallPart):
            calls[index] = DeltaToolCall(part.tool_name, part.args_as_json_str(), tool_call_id=part.tool_call_id)
    if calls:
        yield calls


def build_agent(
    provider: Provider,
    ledger: LedgerStore | None = None,
    crash_in: str | None = None,
    approval: bool = False,
    engine: tuple[Any, Callable[[Any], Any]] | None = None,
    book_refund: Callable[[Any, dict[str, Any]], object] | None = None,
) -> Agent[None, Any]:
    """The support agent; durable on *ledger* when given. *crash_in*: the tool after whose effect the process
    dies (for the crash tests). *approval*: the refund waits for a person (Pydantic AI's ``requires_approval``:
    the run's output is then ``DeferredToolRequests``, answered by a new run given ``deferred_tool_results``).
    *engine*: another durability capability instead, and the decorator its docs put on a tool with effects
    (``(DBOSDurability(), DBOS.step())``: benchmarks/pydantic_ai_peer.py). *book_refund*: the refund is a write
    to the ledger's own database instead, ``book_refund(current_transaction(), payload)``, declared
    ``effect="transactional"`` (a SQLite or PostgreSQL *ledger*): it commits with the call's record."""
    refund_effect = "transactional" if book_refund is not None else "external"
    capabilities: list[Any] = [LedgerDurability(ledger, effects={"refund": refund_effect})] if ledger else []
    step: Callable[[Any], Any] = lambda fn: fn  # noqa: E731
    if engine is not None:
        capabilities, step = [engine[0]], engine[1]
    agent: Agent[None, Any] = Agent(
        FunctionModel(support_model, stream_function=support_stream),
        name="support",
        instructions="You are a support agent: refund, tell the customer, send the receipt.",
        capabilities=capabilities,
        output_type=[str, DeferredToolRequests] if approval else str,
    )

    def apply(kind: str, payload: dict[str, Any]) -> str:
        result = provider.apply(kind, payload, idempotency_key=current_idempotency_key())
        if crash_in == kind:
            os._exit(9)  # the effect is done, the tool has not returned: a kill -9 here
        return str(result["effect_id"])

    @agent.tool_plain(requires_approval=approval)
    @step
    def refund(order: str, amount: float) -> str:
        """Refund *amount* on *order*."""
        if book_refund is not None:
            return f"refund {book_refund(current_transaction(), {'order': order, 'amount': amount})}"
        return f"refund {apply('refund', {'order': order, 'amount': amount})}"

    @agent.tool_plain
    @step
    def email(to: str, text: str) -> str:
        """Email the customer."""
        return f"email {apply('email', {'to': to, 'text': text})}"

    @agent.tool_plain
    @step
    def receipt(order: str) -> str:
        """Send the receipt for *order*."""
        return f"receipt {apply('receipt', {'order': order})}"

    return agent


def open_ledger(where: str) -> Any:
    """A ledger store on a SQLite file, or on PostgreSQL (``DSN#schema``)."""
    if where.startswith("postgresql://"):
        from tenxgraph.storage.checkpointer.pg import PgCheckpointer

        dsn, _, schema = where.rpartition("#")
        return PgCheckpointer(postgres_dsn=dsn, schema=schema)
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    return SqliteCheckpointer(where)


def main(argv: list[str]) -> None:
    from pytest_replaysafe.run.effects import Effects

    effects_db, where, run_id = argv[:3]
    crash_in = argv[3] if len(argv) > 3 else None
    ledger = open_ledger(where) if where != "bare" else None
    agent = build_agent(Effects(effects_db), ledger, crash_in)
    print(agent.run_sync("Please refund order A-1042.", run_id=run_id).output)
    print(f"asked the model {len(ASKED)} times")
    if ledger is not None:
        ledger.close()


if __name__ == "__main__":
    main(sys.argv[1:])
