"""The ledger, public (``tenxgraph.ledger``): an agent loop of its own runs its calls through the entry over a
store that holds only the ledger (the six ``LedgerStore`` methods, no checkpointer), and LangGraph's ToolNode
takes that store too. Effects are counted in the tools' bodies, outside the ledger."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from tenxgraph.core import crashpoints
from tenxgraph.ledger import (
    CallGroups,
    LedgerStore,
    Tool,
    ToolExecution,
    current_tool_call,
    invoke_tool_call,
    invoke_tool_calls,
    ledger_key,
    probe,
)
from tenxgraph.state import Message, ToolCallBlock
from tenxgraph.state.messages import JSON
from tenxgraph.utils.errors import SerializationError


class LedgerOnly:
    """A store of a user's own: a dict per thread, with the ledger's six methods and nothing else."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict[str, JSON]] = {}
        self.writes: list[int] = []  # the size of each write: 1, or a group commit's

    async def aget_tool_results(self, thread_id: str, keys: Sequence[str]) -> dict[str, dict[str, JSON]]:
        return {k: self.rows[(thread_id, k)] for k in keys if (thread_id, k) in self.rows}

    async def aput_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        return (await self.aput_tool_results(thread_id, [(key, record)]))[0] is True

    async def aput_tool_results(
        self, thread_id: str, records: Sequence[tuple[str, dict[str, JSON]]]
    ) -> list[bool | SerializationError]:
        self.writes.append(len(records))
        written: list[bool | SerializationError] = []
        for key, record in records:
            old = self.rows.get((thread_id, key))
            fresh = old is None or old.get("kind") == "intent"
            if fresh:
                self.rows[(thread_id, key)] = record
            written.append(fresh)
        return written

    async def aput_tool_intent(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        return self.rows.setdefault((thread_id, key), record) is record

    async def atransact(self, thread_id: str, key: str, work: Callable[[Any], Any]) -> tuple[dict[str, JSON], bool]:
        raise NotImplementedError("this store has no transaction")

    async def acheck_run_lock(self, thread_id: str) -> None:
        return None


def refund_tools(runs: Counter[str], keys: list[str | None]) -> dict[str, Tool]:
    async def refund(order_id: str, idempotency_key: str) -> str:
        await asyncio.sleep(0)
        info = current_tool_call()
        assert info is not None and info.idempotency_key == idempotency_key  # (the key the body is given)
        keys.append(idempotency_key)
        runs[order_id] += 1
        return f"refunded {order_id}"

    tool = Tool.from_function(refund, effect="idempotent")
    return {tool.name: tool}


def message(*orders: str) -> Message:
    calls = [ToolCallBlock(f"call_{i}", "refund", {"order_id": o}) for i, o in enumerate(orders)]
    return Message.assistant(tool_calls=calls, message_id="msg-1")


def test_a_store_with_only_the_ledger_is_one() -> None:
    assert isinstance(LedgerOnly(), LedgerStore)
    assert not isinstance(object(), LedgerStore)


def test_an_agent_loop_of_its_own_runs_each_call_once_over_a_ledger_only_store() -> None:
    store, runs, keys = LedgerOnly(), Counter[str](), list[str | None]()
    tools = refund_tools(runs, keys)
    first = asyncio.run(invoke_tool_calls(message("A", "B", "C"), tools, store, "t1"))
    again = asyncio.run(invoke_tool_calls(message("A", "B", "C"), tools, store, "t1"))  # a resume
    assert runs == Counter({"A": 1, "B": 1, "C": 1})
    assert [e.replayed for e in first] == [False] * 3 and [e.replayed for e in again] == [True] * 3
    assert [e.result.output for e in again] == [e.result.output for e in first]
    assert sorted(k for _, k in store.rows) == sorted(ledger_key("msg-1", f"call_{i}") or "" for i in range(3))
    assert len(set(keys)) == 3 and None not in keys  # one idempotency key per call, seen by the body


def test_a_crash_after_a_record_leaves_that_call_answered_from_it() -> None:
    store, runs, keys = LedgerOnly(), Counter[str](), list[str | None]()
    tools = refund_tools(runs, keys)
    with crashpoints.armed("tool.after_record"), pytest.raises(crashpoints.CrashInjected):
        asyncio.run(invoke_tool_calls(message("A"), tools, store, "t1"))
    (resumed,) = asyncio.run(invoke_tool_calls(message("A"), tools, store, "t1"))
    assert runs["A"] == 1 and resumed.replayed


def test_calls_handed_over_one_by_one_share_a_group_through_call_groups() -> None:
    """The per-call entry, as LangGraph's ToolNode drives it: each call on its own, concurrently, the message's
    group shared; the calls that return together are written together."""
    store, runs, keys = LedgerOnly(), Counter[str](), list[str | None]()
    tools, groups, msg = refund_tools(runs, keys), CallGroups(), message("A", "B", "C")

    async def one(index: int) -> ToolExecution:
        group = groups.join(store, "t1", msg)
        try:
            return await invoke_tool_call(msg, index, tools, store, "t1", group=group)
        finally:
            groups.passed(group)

    async def all_three() -> list[ToolExecution]:
        return list(await asyncio.gather(*(one(i) for i in range(3))))

    assert [e.replayed for e in asyncio.run(all_three())] == [False] * 3
    assert sum(store.writes) == 3 and max(store.writes) > 1  # (returned in one turn: one group commit)
    assert [e.replayed for e in asyncio.run(all_three())] == [True] * 3 and sum(runs.values()) == 3


def test_the_probe_fires_an_armed_point_and_does_nothing_otherwise() -> None:
    probe.point("tool.in_flight")  # disarmed: nothing
    assert not probe.ordered() and probe.turns([], patience=1.0) is None
    with crashpoints.armed("tool.in_flight"), pytest.raises(crashpoints.CrashInjected, match=r"tool\.in_flight"):
        probe.point("tool.in_flight")


def test_a_crash_ends_every_order_the_probe_made_so_a_resume_on_the_same_loop_makes_its_own() -> None:
    """An async LangGraph graph crashed in-process and resumed on the same event loop: its batch's order, whose
    crashed calls never finish, must not hold the resumed calls (a depth-2 schedule on PostgreSQL hung so)."""
    from tenxgraph.core.graph.utils.instrument import set_completion_order
    from tenxgraph.core.tools.context import ToolCallInfo

    remove = set_completion_order(lambda calls: [c.index for c in calls])
    try:

        async def go() -> None:
            calls = [ToolCallInfo("t", "m1", f"c{i}", "refund", i, None) for i in range(2)]
            turns = probe.turns(calls, patience=30.0)
            assert turns is not None
            turns.start(0)  # the crashed run's first call came in, and never finishes
            waiting = asyncio.ensure_future(turns.wait(1))
            await asyncio.sleep(0.05)
            assert not waiting.done() and not turns.ended  # held behind call 0
            probe.crashed(crashpoints.CrashInjected("tool.in_flight", 1))
            with pytest.raises(crashpoints.CrashInjected):  # released with the crash, not held for ever
                await asyncio.wait_for(waiting, 1.0)
            assert turns.ended and turns.complete

        asyncio.run(go())
    finally:
        remove()


def test_langgraphs_tool_node_takes_a_ledger_only_store() -> None:
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition

    from tenxgraph.integrations.langgraph import ReplaySafeToolNode

    runs: Counter[str] = Counter()

    @tool
    def refund(order_id: str) -> str:
        """Refund an order."""
        runs[order_id] += 1
        return f"refunded {order_id}"

    def model(state: MessagesState) -> dict[str, Any]:
        if any(isinstance(m, ToolMessage) for m in state["messages"]):
            return {"messages": [AIMessage("done")]}
        return {"messages": [AIMessage("", tool_calls=[{"name": "refund", "args": {"order_id": "A"}, "id": "c0"}])]}

    store = LedgerOnly()
    graph = StateGraph(MessagesState)
    graph.add_node("agent", model)
    graph.add_node("tools", ReplaySafeToolNode([refund], ledger=store))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    app = graph.compile(checkpointer=InMemorySaver())
    app.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "t1"}})
    assert runs["A"] == 1 and len(store.rows) == 1
