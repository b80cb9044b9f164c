"""What ``ReplaySafeToolNode`` costs in ledger round trips (#52, item 3): one ledger read per step of parallel
calls, whatever their number and LangGraph's thread pool (its calls come one by one, in waves past the pool's
size), under ``invoke`` and ``ainvoke``; a resumed or re-run step reads afresh. Reads are counted by a store
around the ledger, outside it; effects by the tools' bodies."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="the langgraph extra is not installed: pip install 'tenxgraph[langgraph]'")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

from tenxgraph.core import crashpoints
from tenxgraph.integrations.langgraph import ReplaySafeToolNode
from tenxgraph.ledger import SharedRead
from tenxgraph.state.messages import JSON
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tenxgraph.storage.checkpointer.delegating import DelegatingCheckpointer


class CountedReads(DelegatingCheckpointer):
    """The ledger, its batched reads counted (each one round trip)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.reads = 0

    async def aget_tool_results(self, thread_id: str, keys: Sequence[str]) -> dict[str, dict[str, JSON]]:
        self.reads += 1
        return await self.inner.aget_tool_results(thread_id, keys)


def graph(node: Any, n: int) -> Any:
    """A model that asks for *n* refunds at once, then says done; the refunds through *node*."""

    def model(state: MessagesState) -> dict[str, Any]:
        if any(isinstance(m, AIMessage) for m in state["messages"]):
            return {"messages": [AIMessage("done")]}
        asked = [{"name": "refund", "args": {"order": f"o{i}"}, "id": f"c{i}"} for i in range(n)]
        return {"messages": [AIMessage("", tool_calls=asked, id="ai-1")]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", model)
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=InMemorySaver())


def refunds(effects: Counter[str]) -> Any:
    @tool
    def refund(order: str) -> str:
        """Refund an order."""
        effects[order] += 1
        return f"refunded {order}"

    return refund


@pytest.fixture
def ledger(tmp_path: Path) -> Any:
    store = CountedReads(SqliteCheckpointer(tmp_path / "ledger.db"))
    yield store
    store.inner.close()


CFG: dict[str, Any] = {"configurable": {"thread_id": "t1"}}


@pytest.mark.parametrize("n", [1, 4, 16])
@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_one_ledger_read_per_step_of_parallel_calls(ledger: Any, n: int, mode: str) -> None:
    effects: Counter[str] = Counter()
    app = graph(ReplaySafeToolNode([refunds(effects)], ledger=ledger), n)
    go = {"messages": [HumanMessage("go")]}
    if mode == "invoke":
        result = app.invoke(go, CFG, durability="sync")
    else:
        result = asyncio.run(app.ainvoke(go, CFG, durability="sync"))
    assert result["messages"][-1].content == "done"
    assert effects == Counter({f"o{i}": 1 for i in range(n)})
    assert len(ledger.inner.list_tool_results("t1")) == n  # every call recorded
    assert ledger.reads == 1  # (one per call before: n)


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_step_converts_its_message_and_checks_its_tool_once(
    ledger: Any, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LangGraph hands each of a step's 16 calls the same AIMessage and tool objects: the message is converted
    for the ledger once (not 16 times, each of 16 calls), the tool's declarations checked once; a second run's
    new message is converted again."""
    from tenxgraph.integrations.langgraph import messages, tools
    from tenxgraph.ledger import effect_from_hints

    converted: list[str | None] = []
    hints: list[str] = []

    def counted(ai: AIMessage) -> Any:
        converted.append(ai.id)
        return messages.assistant_message(ai)

    def counted_hints(meta: Any) -> Any:
        hints.append("checked")
        return effect_from_hints(meta)

    monkeypatch.setattr(tools, "assistant_message", counted)
    monkeypatch.setattr(tools, "effect_from_hints", counted_hints)
    effects: Counter[str] = Counter()
    node = ReplaySafeToolNode([refunds(effects)], ledger=ledger)
    app = graph(node, 16)
    for thread in ("t1", "t2"):
        cfg = {"configurable": {"thread_id": thread}}
        go = {"messages": [HumanMessage("go")]}
        if mode == "invoke":
            app.invoke(go, cfg, durability="sync")
        else:
            asyncio.run(app.ainvoke(go, cfg, durability="sync"))
    assert effects == Counter({f"o{i}": 2 for i in range(16)})
    assert converted == ["ai-1", "ai-1"]  # (each thread's message is a new object: converted once each)
    assert hints == ["checked"]  # (by the constructor, which checks each tool: not again by its 32 calls)


def test_an_identity_memo_converts_each_object_once_and_forgets_the_oldest() -> None:
    from tenxgraph.utils.memo import IdentityMemo

    made: list[int] = []

    def convert(obj: list[int]) -> int:
        made.append(len(obj))
        return len(obj)

    memo: IdentityMemo[list[int], int] = IdentityMemo(convert, size=2)
    a, b, c = [1], [1, 2], [1, 2, 3]
    assert [memo.get(a), memo.get(a), memo.get([1])] == [1, 1, 1]  # (an equal object is another object)
    assert made == [1, 1]
    memo.get(b)
    memo.get(c)  # (size 2: a and the other [1] are forgotten, the oldest first)
    assert (memo.get(c), memo.get(a), len(memo)) == (3, 1, 2)
    assert made == [1, 1, 2, 3, 1]
    with pytest.raises(ValueError, match="at least one"):
        IdentityMemo(convert, size=0)


def test_a_message_changed_in_place_is_converted_again() -> None:
    """The wrapper's memo checks each reuse against the message's id and calls: an AIMessage given another id or
    another call in place (same object) is not answered from its first conversion."""
    from langchain_core.messages import AIMessage

    from tenxgraph.integrations.langgraph.messages import assistant_message
    from tenxgraph.integrations.langgraph.tools import _shape
    from tenxgraph.utils.memo import IdentityMemo

    memo = IdentityMemo(assistant_message, fingerprint=_shape)
    ai = AIMessage("", id="ai-1", tool_calls=[{"name": "refund", "args": {"order": "o1"}, "id": "c1"}])
    first = memo.get(ai)
    assert memo.get(ai) is first
    ai.tool_calls.append({"name": "refund", "args": {"order": "o2"}, "id": "c2"})
    grown = memo.get(ai)
    assert [call.id for call in grown.tool_calls] == ["c1", "c2"]
    ai.id = "ai-2"
    assert (grown.message_id, memo.get(ai).message_id) == ("ai-1", "ai-2")


def test_a_step_run_again_in_the_same_process_reads_again(ledger: Any) -> None:
    """A crash after the second record, then the same node resumes the step in the same process: a new execution
    of the step reads the ledger afresh (the first execution's read predates two records), so the recorded calls
    replay and the others run: each refund once."""
    effects: Counter[str] = Counter()
    app = graph(ReplaySafeToolNode([refunds(effects)], ledger=ledger), 4)
    with crashpoints.armed("tool.after_record", 2), pytest.raises(crashpoints.CrashInjected):
        app.invoke({"messages": [HumanMessage("go")]}, CFG, durability="sync")
    assert ledger.reads == 1
    result = app.invoke(None, CFG, durability="sync")
    assert result["messages"][-1].content == "done"
    assert effects == Counter({f"o{i}": 1 for i in range(4)})
    replayed = [m for m in result["messages"] if isinstance(m, ToolMessage) and m.response_metadata.get("replayed")]
    assert len(replayed) >= 2  # the two recorded before the crash (siblings may have recorded as it happened)
    assert ledger.reads == 2


def test_a_shared_read_goes_to_the_store_once_for_callers_that_meet() -> None:
    async def main() -> None:
        read, started, release = SharedRead(), asyncio.Event(), asyncio.Event()
        fetched = 0

        async def fetch() -> dict[str, JSON]:
            nonlocal fetched
            fetched += 1
            started.set()
            await release.wait()
            return {"k": {"v": 1}}

        callers = [asyncio.ensure_future(read.get(fetch)) for _ in range(5)]
        await started.wait()
        release.set()
        assert [await c for c in callers] == [{"k": {"v": 1}}] * 5
        assert await read.get(fetch) == {"k": {"v": 1}}  # a later sibling answers from it too
        assert (fetched, read.reads) == (1, 1)

    asyncio.run(main())


def test_a_failed_shared_read_fails_its_waiters_and_the_next_caller_reads_again() -> None:
    async def main() -> None:
        read, release = SharedRead(), asyncio.Event()
        outcomes = iter([OSError("store down"), {"k": {"v": 2}}])

        async def fetch() -> dict[str, JSON]:
            await release.wait()
            outcome = next(outcomes)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        waiting = [asyncio.ensure_future(read.get(fetch)) for _ in range(3)]
        await asyncio.sleep(0)
        release.set()
        failed = await asyncio.gather(*waiting, return_exceptions=True)
        assert [str(f) for f in failed] == ["store down"] * 3
        assert await read.get(fetch) == {"k": {"v": 2}}
        assert read.reads == 2

    asyncio.run(main())


def test_a_cancelled_caller_leaves_the_read_to_its_siblings() -> None:
    async def main() -> None:
        read, release = SharedRead(), asyncio.Event()

        async def fetch() -> dict[str, JSON]:
            await release.wait()
            return {"k": {"v": 3}}

        leader = asyncio.ensure_future(read.get(fetch))
        await asyncio.sleep(0)
        sibling = asyncio.ensure_future(read.get(fetch))
        await asyncio.sleep(0)
        leader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leader
        release.set()
        assert await sibling == {"k": {"v": 3}}
        assert read.reads == 1

    asyncio.run(main())


def test_a_known_read_answers_without_the_store() -> None:
    async def never() -> dict[str, JSON]:
        raise AssertionError("the store was read")

    read = SharedRead.known({"k": {"v": 4}})
    assert asyncio.run(read.get(never)) == {"k": {"v": 4}}
    assert read.reads == 0
