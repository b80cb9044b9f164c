"""Retention and LangGraph threads: the ledger's prune keeps the records of a thread it cannot see finished (our
``threads`` table has no row for a LangGraph thread), so a thread paused for a person longer than the retention
period does not re-run its finished calls when resumed; ``prune_ledger`` asks LangGraph's saver which threads are
finished and prunes theirs."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="the langgraph extra is not installed: pip install 'tenxgraph[langgraph]'")

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command, interrupt

from tenxgraph.integrations.langgraph import ReplaySafeToolNode, aprune_ledger, prune_ledger
from tenxgraph.storage.checkpointer import BaseCheckpointer, InMemoryCheckpointer, SqliteCheckpointer

PAUSED = {"configurable": {"thread_id": "paused"}}
DONE = {"configurable": {"thread_id": "done"}}


class Support:
    """One turn asks for a refund and a person's approval at once: the refund runs and is recorded, the approval
    pauses the tool step (LangGraph's ``interrupt()``); resumed, LangGraph runs the whole step again."""

    def __init__(self, ledger: BaseCheckpointer, saver: Any) -> None:
        self.refunds: list[str] = []

        @tool
        def refund_order(order_id: str) -> str:
            """Refund an order."""
            self.refunds.append(order_id)
            return f"refunded {order_id}"

        @tool
        def ask_person(question: str) -> str:
            """Ask a person."""
            return str(interrupt(question))

        def model(state: MessagesState) -> dict[str, Any]:
            if any(m.type == "tool" for m in state["messages"]):
                return {"messages": [AIMessage("done")]}
            asks = [{"name": "refund_order", "args": {"order_id": "1042"}, "id": "call_0"},
                    {"name": "ask_person", "args": {"question": "close the ticket?"}, "id": "call_1"}]  # fmt: skip
            return {"messages": [AIMessage("", tool_calls=asks, id="ai-1")]}

        graph = StateGraph(MessagesState)
        for name, node in (("agent", model), ("tools", ReplaySafeToolNode([refund_order, ask_person], ledger=ledger))):
            graph.add_node(name, node)
        graph.set_entry_point("agent")  # (the agent, its tools when it asks for some, the agent again)
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        self.app = graph.compile(checkpointer=saver)

    def start(self, config: dict[str, Any]) -> dict[str, Any]:
        return dict(self.app.invoke({"messages": [HumanMessage("refund 1042")]}, config, durability="sync"))

    def answer(self, config: dict[str, Any]) -> dict[str, Any]:
        return dict(self.app.invoke(Command(resume="yes"), config, durability="sync"))


@pytest.fixture(params=["sqlite", "memory"])
def support(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        ledger: BaseCheckpointer = SqliteCheckpointer(tmp_path / "ledger.db")
        conn = sqlite3.connect(tmp_path / "langgraph.db", check_same_thread=False)
        yield Support(ledger, SqliteSaver(conn)), ledger
        conn.close()
    else:
        ledger = InMemoryCheckpointer()
        yield Support(ledger, InMemorySaver()), ledger
    ledger.close()


def test_a_paused_langgraph_thread_keeps_its_records_through_a_prune_and_runs_nothing_again(support: Any) -> None:
    agent, ledger = support
    assert "__interrupt__" in agent.start(PAUSED) and agent.refunds == ["1042"]
    assert len(ledger.list_tool_results("paused")) == 1  # the refund's record (the question is pending)
    assert ledger.prune_tool_executions(timedelta(0)) == 0  # no row of ours says it finished: kept
    assert prune_ledger(ledger, agent.app, timedelta(0)) == 0  # LangGraph's saver says it waits: kept
    result = agent.answer(PAUSED)
    assert result["messages"][-1].content == "done" and agent.refunds == ["1042"]  # replayed, not run again
    assert prune_ledger(ledger, agent.app, timedelta(days=1)) == 0  # finished now, but younger than a day
    assert prune_ledger(ledger, agent.app, timedelta(0)) == 3 and ledger.list_tool_results("paused") == {}


def test_a_prune_that_ignores_the_pause_makes_the_refund_run_again(support: Any) -> None:
    """The control: the records pruned while the thread waits (as the retention job did before it could tell)."""
    agent, ledger = support
    agent.start(PAUSED)
    assert ledger.prune_tool_executions(timedelta(0), include_resumable=True) == 1
    agent.answer(PAUSED)
    assert agent.refunds == ["1042", "1042"]


def test_prune_ledger_prunes_finished_threads_and_only_those(support: Any) -> None:
    agent, ledger = support
    agent.start(DONE)
    agent.answer(DONE)
    agent.start(PAUSED)
    assert prune_ledger(ledger, agent.app, timedelta(0)) == 3  # the refund, the question, its answer (a decision)
    assert ledger.list_tool_results("done") == {} and len(ledger.list_tool_results("paused")) == 1


def test_aprune_ledger_reads_the_savers_async_methods() -> None:
    ledger = InMemoryCheckpointer()
    agent = Support(ledger, InMemorySaver())
    agent.start(DONE)
    agent.answer(DONE)
    agent.start(PAUSED)
    assert asyncio.run(aprune_ledger(ledger, agent.app, timedelta(0))) == 3
    assert ledger.list_tool_results("done") == {} and len(ledger.list_tool_results("paused")) == 1


def test_prune_ledger_names_a_graph_without_a_saver(tmp_path: Path) -> None:
    ledger = SqliteCheckpointer(tmp_path / "ledger.db")
    agent = Support(ledger, None)
    with pytest.raises(TypeError, match=r"has no saver of its own: give the graph compiled with its checkpointer"):
        prune_ledger(ledger, agent.app, timedelta(0))
    ledger.close()
