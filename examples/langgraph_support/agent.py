"""A LangGraph agent as LangGraph's own docs write one: ``StateGraph(MessagesState)``, a model node, LangGraph's
``ToolNode`` and ``tools_condition``. One model turn asks for three tools at once (refund, email, ticket), the next
for a receipt.

``build_agent(saver, provider)`` is the agent with a bare ``ToolNode``; ``build_agent(saver, provider,
ledger=checkpointer)`` the same agent with ``ReplaySafeToolNode``, which records each call as it returns; with
``book_refund=`` its refund is a write to the ledger's own database, declared ``effect="transactional"``: the write
and the call's record commit in one transaction (``current_transaction()``). The model
is a node that answers from the conversation so far, as a scripted chat model would (no API key, the same reply in
every process)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt

from examples.payments import LocalProvider, Provider
from tenxgraph.integrations.langgraph import ReplaySafeToolNode, current_idempotency_key, current_transaction
from tenxgraph.storage.checkpointer import BaseCheckpointer

FINAL = "Refunded, emailed, and opened a ticket."


#: A refund booked in the ledger's database: ``book(transaction, payload)``, the effect's id.
BookRefund = Callable[[Any, dict[str, Any]], object]


def make_tools(provider: Provider, book_refund: BookRefund | None = None, ask: bool = False) -> list[BaseTool]:
    """The tools pass the provider the call's idempotency key: ReplaySafeToolNode's (the same on every replay);
    under a bare ToolNode there is none (None). With *book_refund*, the refund is written in the call's
    transaction instead; with *ask*, the refund asks a person first with LangGraph's own ``interrupt()``."""

    @tool
    def refund_order(order_id: str, amount: float) -> str:
        """Refund an amount on an order."""
        if ask and interrupt({"refund": order_id, "amount": amount}) is not True:
            return "not refunded"
        payload = {"order": order_id, "amount": amount}
        if book_refund is not None:  # the row commits with the call's ledger record, or not at all
            return str(book_refund(current_transaction(), payload))
        return str(provider.apply("refund", payload, current_idempotency_key())["effect_id"])

    @tool
    def send_email(to: str, subject: str) -> str:
        """Send an email."""
        return str(provider.apply("email", {"to": to, "subject": subject}, current_idempotency_key())["effect_id"])

    @tool
    def open_ticket(title: str) -> str:
        """Open a support ticket."""
        return str(provider.apply("ticket", {"title": title}, current_idempotency_key())["effect_id"])

    # the ticket system deduplicates on the key: a tool that may simply run again says so in its metadata (the
    # ledger then marks no in-doubt window for it)
    open_ticket.metadata = {"effect": "idempotent"}
    return [refund_order, send_email, open_ticket]


#: The model's turns: three calls at once, then a receipt (its call id repeats the first turn's, as some models'
#: do: the ledger key is the message id and the call id together), then the answer.
TURNS: list[list[tuple[str, dict[str, Any]]]] = [
    [
        ("refund_order", {"order_id": "1042", "amount": 20.0}),
        ("send_email", {"to": "ada@example.com", "subject": "Your refund"}),
        ("open_ticket", {"title": "Refund 1042 follow-up"}),
    ],
    [("send_email", {"to": "ada@example.com", "subject": "Your receipt"})],
]


#: One call a turn: the refund, then the receipt.
ONE_BY_ONE: list[list[tuple[str, dict[str, Any]]]] = [TURNS[0][:1], TURNS[1]]


def model(state: MessagesState, turns: list[list[tuple[str, dict[str, Any]]]] = TURNS) -> dict[str, Any]:
    turn = sum(1 for m in state["messages"] if m.type == "ai")
    if turn < len(turns):
        calls = [{"name": n, "args": a, "id": f"call_{i}", "type": "tool_call"} for i, (n, a) in enumerate(turns[turn])]
        return {"messages": [AIMessage("", tool_calls=calls)]}
    return {"messages": [AIMessage(FINAL)]}


async def amodel(state: MessagesState) -> dict[str, Any]:
    """The model as an async node (a graph with one runs through ``ainvoke`` / ``astream`` only)."""
    return model(state)


def one_by_one(state: MessagesState) -> dict[str, Any]:
    """The model asking for one call a turn (:data:`ONE_BY_ONE`)."""
    return model(state, ONE_BY_ONE)


def build_agent(
    saver: BaseCheckpointSaver[Any] | None,
    provider: Provider | None = None,
    ledger: BaseCheckpointer | None = None,
    book_refund: BookRefund | None = None,
    run_async: bool = False,
    approvals: dict[str, Any] | None = None,
    ask_in_tool: bool = False,
    one_call_a_turn: bool = False,
) -> Any:
    """The agent over LangGraph's *saver*; with *ledger*, its tools go through ReplaySafeToolNode; with
    *book_refund* (and a SQLite or PostgreSQL *ledger*), its refund is transactional; with *run_async*, its model
    is an async node; with *approvals* (``{"refund_order": True}``), those calls wait for a person's answer;
    with *ask_in_tool*, the refund's body asks with LangGraph's ``interrupt()`` (as LangGraph's docs show); with
    *one_call_a_turn*, the model asks for the refund alone, then the receipt."""
    tools = make_tools(provider or LocalProvider(), book_refund, ask_in_tool)
    effects = {"refund_order": "transactional"} if book_refund is not None else None
    node = (
        ToolNode(tools)
        if ledger is None
        else ReplaySafeToolNode(tools, ledger=ledger, effects=effects, approvals=approvals)
    )
    graph = StateGraph(MessagesState)
    graph.add_node("agent", amodel if run_async else one_by_one if one_call_a_turn else model)
    graph.add_node("tools", node)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)
