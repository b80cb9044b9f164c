"""Group commit of ledger records, proven by counting writes (each ledger write is one transaction), not by time:
parallel calls that return together are recorded in one write; a failed group write or an unstorable record
leaves each call exactly where it would be alone."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from tenxgraph import Message, ReactAgent, Reply, ScriptedModel
from tenxgraph.errors import SerializationError
from tenxgraph.state.messages import JSON
from tenxgraph.storage.checkpointer import BaseCheckpointer
from tenxgraph.storage.checkpointer.delegating import DelegatingCheckpointer
from tenxgraph.utils.sync import wait_threads_idle


class CountingWrites(DelegatingCheckpointer):
    """Counts ledger writes (one transaction each) and the records in each."""

    def __init__(self, inner: BaseCheckpointer) -> None:
        super().__init__(inner)
        self.writes: list[int] = []
        self.fail_groups = False

    async def aput_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        self.writes.append(1)
        return await super().aput_tool_result(thread_id, key, record)

    async def aput_tool_results(
        self, thread_id: str, records: Sequence[tuple[str, dict[str, JSON]]]
    ) -> list[bool | SerializationError]:
        self.writes.append(len(records))
        if self.fail_groups:
            raise ConnectionError("the database went away mid-commit")
        return await self.inner.aput_tool_results(thread_id, records)


def fan_out(n: int, runs: dict[str, int], result: object = None) -> ReactAgent:
    """One assistant message with *n* parallel calls of a tool whose bodies all return at the same moment."""
    everyone = asyncio.Event()
    started = 0

    async def fetch(item: int) -> object:
        """Fetch an item."""
        nonlocal started
        runs[str(item)] = runs.get(str(item), 0) + 1
        started += 1
        if started == n:
            everyone.set()
        await everyone.wait()
        return result if result is not None and item == 0 else f"item {item}"

    model = ScriptedModel([Reply(tool_calls=[("fetch", {"item": i}) for i in range(n)]), "All fetched."])
    return ReactAgent(model, tools=[fetch])


@pytest.mark.parametrize("n", [1, 4, 16])
def test_calls_that_return_together_are_recorded_in_one_write(checkpointer: BaseCheckpointer, n: int) -> None:
    counting = CountingWrites(checkpointer)
    runs: dict[str, int] = {}
    app = fan_out(n, runs).compile(checkpointer=counting)
    result = app.invoke({"messages": [Message.user("fetch them")]}, {"thread_id": f"fan-{n}"})
    assert result.final_text == "All fetched." and len(runs) == n
    assert counting.writes == [n]  # one ledger transaction for the whole group (it was n before)
    assert len(checkpointer.list_tool_results(f"fan-{n}")) == n
    again = app.invoke(None, {"thread_id": f"fan-{n}"})  # nothing to resume: nothing runs again
    assert again.final_text == "All fetched." and set(runs.values()) == {1}


class BlockingFirstWrite(CountingWrites):
    """A first ledger write that blocks the event loop (as SQLite's do) until every other call has returned: their
    calls are ready to go on when it ends, but none could record during it."""

    def __init__(self, inner: BaseCheckpointer, release: threading.Event, returned: threading.Semaphore) -> None:
        super().__init__(inner)
        self.release, self.returned, self.others = release, returned, 0

    async def aput_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        if not self.writes:
            self.release.set()
            for _ in range(self.others):  # synchronously, like a blocking write: the loop runs nothing meanwhile
                assert self.returned.acquire(timeout=30)
            assert wait_threads_idle(30)  # and their worker threads have handed their results back to the loop
        return await super().aput_tool_result(thread_id, key, record)


def test_records_of_calls_that_returned_during_a_blocking_write_are_written_together(
    checkpointer: BaseCheckpointer,
) -> None:
    """Without the writer's turn of the event loop before each group, each of those calls wrote alone (n - 1
    writes after the first); now they are one group."""
    n = 8
    release, returned = threading.Event(), threading.Semaphore(0)

    def fetch(item: int) -> str:
        """Fetch an item (a plain function: it runs in a worker thread)."""
        if item:
            release.wait(30)
            returned.release()
        return f"item {item}"

    model = ScriptedModel([Reply(tool_calls=[("fetch", {"item": i}) for i in range(n)]), "All fetched."])
    counting = BlockingFirstWrite(checkpointer, release, returned)
    counting.others = n - 1
    app = ReactAgent(model, tools=[fetch]).compile(checkpointer=counting)
    result = app.invoke({"messages": [Message.user("fetch them")]}, {"thread_id": "blocked"})
    assert result.final_text == "All fetched."
    assert counting.writes == [1, n - 1]
    assert len(checkpointer.list_tool_results("blocked")) == n


def test_a_replay_after_a_group_write_runs_nothing_again(checkpointer: BaseCheckpointer) -> None:
    """The records of a group are replayed like single ones when the node runs again (a crash after the write)."""
    counting = CountingWrites(checkpointer)
    runs: dict[str, int] = {}
    app = fan_out(4, runs).compile(checkpointer=counting)
    from tenxgraph.core import crashpoints

    with crashpoints.armed("node.after_complete", 1, "raise"), pytest.raises(crashpoints.CrashInjected):
        app.invoke({"messages": [Message.user("fetch them")]}, {"thread_id": "crashy"})
    crashpoints.reset()
    app.invoke(None, {"thread_id": "crashy"})
    assert runs == {"0": 1, "1": 1, "2": 1, "3": 1} and counting.writes == [4]


def test_a_failed_group_write_is_the_failed_record_write_gap_for_each_call(checkpointer: BaseCheckpointer) -> None:
    counting = CountingWrites(checkpointer)
    counting.fail_groups = True
    runs: dict[str, int] = {}
    app = fan_out(3, runs).compile(checkpointer=counting)
    result = app.invoke({"messages": [Message.user("fetch them")]}, {"thread_id": "failing"})
    assert result.final_text == "All fetched."  # the node completed with every call's own result
    tool_results = [r.output for m in result.state.messages for r in m.tool_results]
    assert tool_results == ["item 0", "item 1", "item 2"]
    assert checkpointer.list_tool_results("failing") == {}  # and none is recorded: each may run again


def test_an_unstorable_record_in_a_group_does_not_fail_its_siblings(checkpointer: BaseCheckpointer) -> None:
    counting = CountingWrites(checkpointer)
    runs: dict[str, int] = {}
    app = fan_out(3, runs, result="bad \x00 value").compile(checkpointer=counting)
    result = app.invoke({"messages": [Message.user("fetch them")]}, {"thread_id": "nul"})
    outputs = [r.output for m in result.state.messages for r in m.tool_results]
    assert "cannot be stored" in str(outputs[0]) and outputs[1:] == ["item 1", "item 2"]
    records = checkpointer.list_tool_results("nul")
    assert len(records) == 3  # the siblings' results, and the bad one's error in its place: nothing re-runs
    assert counting.writes[0] == 3
    app.invoke(None, {"thread_id": "nul"})
    assert set(runs.values()) == {1}


def test_a_writer_cancelled_before_its_write_hands_the_group_on() -> None:
    """The first record's writer yields once before writing; cancelled there, it must not leave the others waiting
    for a writer that will never come."""
    from tenxgraph.core.graph.utils.record_batch import RecordBatch
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    async def scenario() -> list[bool]:
        cp = InMemoryCheckpointer()
        batch = RecordBatch(cp, "t")
        first = asyncio.ensure_future(batch.put("m:0", {"output": 0}))
        await asyncio.sleep(0)  # the first is now the writer, yielding once before its write
        second = asyncio.ensure_future(batch.put("m:1", {"output": 1}))
        first.cancel()
        written = await asyncio.wait_for(second, timeout=5)  # (it waited forever before)
        assert first.cancelled()
        assert await cp.alist_tool_results("t") == {"m:1": {"output": 1}}
        return [written]

    assert asyncio.run(scenario()) == [True]


def test_a_group_write_answered_with_no_outcome_per_record_fails_every_sibling_never_hangs() -> None:
    """A checkpointer whose ``aput_tool_results`` answers something else than one outcome per record (a wrapper
    that returns None) fails the whole group with an error naming the method: its siblings waited forever before."""
    from tenxgraph.core.graph.utils.record_batch import RecordBatch
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    class Mute(DelegatingCheckpointer):
        async def aput_tool_results(self, thread_id: str, records: Sequence[tuple[str, dict[str, JSON]]]) -> None:
            return None

    async def scenario() -> list[BaseException | bool]:
        batch = RecordBatch(Mute(InMemoryCheckpointer()), "t")
        puts = [batch.put(f"m:{i}", {"output": i}) for i in range(3)]
        return await asyncio.wait_for(asyncio.gather(*puts, return_exceptions=True), timeout=5)

    outcomes = asyncio.run(scenario())
    assert len(outcomes) == 3 and all(isinstance(o, TypeError) for o in outcomes), outcomes
    assert "Mute.aput_tool_results answered None for 3 records" in str(outcomes[0])


def fetch_agent(ledger: BaseCheckpointer, fetch: object, calls: int) -> object:
    """LangGraph's agent (``StateGraph`` + ``ReplaySafeToolNode`` over *ledger*, ``InMemorySaver``) whose model asks
    for *calls* parallel ``fetch(item=i)`` calls (ids ``c0``, ``c1``...), then answers."""
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver

    from benchmarks.bench import langgraph_react
    from tenxgraph.integrations.langgraph import ReplaySafeToolNode

    def model(state: dict[str, object]) -> dict[str, object]:
        if not any(isinstance(m, AIMessage) for m in state["messages"]):  # type: ignore[attr-defined]
            asked = [{"name": "fetch", "args": {"item": i}, "id": f"c{i}", "type": "tool_call"} for i in range(calls)]
            return {"messages": [AIMessage(content="", tool_calls=asked)]}
        return {"messages": [AIMessage(content="done")]}

    return langgraph_react(InMemorySaver(), model, [], ReplaySafeToolNode([tool(fetch)], ledger=ledger))


def test_replay_safe_tool_node_records_siblings_that_return_together_in_one_write(tmp_path: object) -> None:
    """LangGraph's ToolNode hands each call to the wrapper on its own; siblings that return together still share
    one write (async tools under ``ainvoke``: they return in the same turn of the loop), and each is recorded."""
    pytest.importorskip("langgraph")
    from langchain_core.messages import HumanMessage

    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    everyone = asyncio.Event()
    started = 0

    async def fetch(item: int) -> str:
        """Fetch an item."""
        nonlocal started
        started += 1
        if started == 4:
            everyone.set()
        await everyone.wait()
        return f"item {item}"

    ledger = CountingWrites(InMemoryCheckpointer())
    app: Any = fetch_agent(ledger, fetch, 4)
    config = {"configurable": {"thread_id": "t"}}
    asyncio.run(app.ainvoke({"messages": [HumanMessage("go")]}, config, durability="sync"))
    assert ledger.writes == [4]  # one write for the four (one each before the group commit)
    assert len(ledger.inner.list_tool_results("t")) == 4


class KeyOrder(DelegatingCheckpointer):
    """Logs the keys of each ledger write, in the order the writes come."""

    def __init__(self, inner: BaseCheckpointer) -> None:
        super().__init__(inner)
        self.keys: list[list[str]] = []

    async def aput_tool_results(
        self, thread_id: str, records: Sequence[tuple[str, dict[str, JSON]]]
    ) -> list[bool | SerializationError]:
        self.keys.append([key for key, _ in records])
        return await self.inner.aput_tool_results(thread_id, records)

    async def aput_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        self.keys.append([key])
        return await super().aput_tool_result(thread_id, key, record)


@pytest.mark.parametrize("order", [[2, 0, 1], [[0, 1, 2]]])
def test_replay_safe_tool_nodes_calls_are_recorded_in_the_harness_order_whatever_their_return_order(
    order: list[int | list[int]],
) -> None:
    """Under a completion order (the crash-matrix harness's), the calls LangGraph hands over one by one from its
    threads (sync ``invoke``) pass from return to record in that order, one at a time or as one group, even when
    they return in another (call 0 returns first, call 2 last here): so which siblings were recorded when a crash
    fires is the seed's doing, not the threads'."""
    pytest.importorskip("langgraph")
    import time

    from langchain_core.messages import HumanMessage

    from tenxgraph.core.graph.utils.instrument import set_completion_order
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    def fetch(item: int) -> str:
        """Fetch an item."""
        time.sleep(0.02 * item)  # call 0 returns first, call 2 last
        return f"item {item}"

    ledger = KeyOrder(InMemoryCheckpointer())
    app: Any = fetch_agent(ledger, fetch, 3)
    batches: list[list[int]] = []
    remove = set_completion_order(lambda calls: batches.append([c.index for c in calls]) or order)
    try:
        app.invoke({"messages": [HumanMessage("go")]}, {"configurable": {"thread_id": "t"}}, durability="sync")
    finally:
        remove()
    assert batches == [[0, 1, 2]]  # the order was asked once, for the message's three calls
    index = {f"{key.split(':')[-1]}": key for keys in ledger.keys for key in keys}
    written = [[k.split(":")[-1] for k in keys] for keys in ledger.keys]
    assert len(index) == 3
    assert written == ([["c2"], ["c0"], ["c1"]] if order == [2, 0, 1] else [["c0", "c1", "c2"]])


def test_handed_over_turns_end_for_a_call_never_handed_over_and_with_a_crash(caplog: pytest.LogCaptureFixture) -> None:
    """A call still waited for that never comes in ends the order after the patience (a WARNING; the waiting call
    passes, nothing hangs); a crash in one call makes every call still waiting raise it (none records after it)."""
    import logging

    from tenxgraph.core.crashpoints import CrashInjected
    from tenxgraph.core.graph.utils.instrument import HandedOverTurns

    async def main() -> None:
        late = HandedOverTurns([0, 1], patience=0.05)
        late.start(1)
        with caplog.at_level(logging.WARNING):
            await asyncio.wait_for(late.wait(1), 5)  # call 0 never came: call 1 passes after the patience
        assert late.ended and "call 0 did not come in" in caplog.text

        crashed = HandedOverTurns([0, 1, 2], patience=5)
        for index in range(3):
            crashed.start(index)
        waiting = [asyncio.ensure_future(crashed.wait(i)) for i in (1, 2)]
        await asyncio.sleep(0.01)
        assert not any(w.done() for w in waiting)  # held behind call 0
        crash = CrashInjected("tool.after_return", 1)
        crashed.abandon(crash)
        for w in waiting:
            with pytest.raises(CrashInjected):
                await w
        assert crashed.complete

    asyncio.run(main())


def test_a_call_answered_from_the_ledger_at_once_does_not_end_its_siblings_order(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A resumed tool node: call 0 is answered from its record at once, before LangGraph hands its siblings over
    (``max_concurrency=1``: one call at a time). The message's order is held until every call has passed, so the
    siblings still find it and pass at once (no wait for a call that already came and went, no WARNING)."""
    pytest.importorskip("langgraph")
    import logging
    import time

    from langchain_core.messages import HumanMessage

    from tenxgraph.core.graph.utils.instrument import set_completion_order
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    class Boom(BaseException):
        """The process dies in the bodies of calls 1 and 2 (the first run)."""

    first_run = [True]

    def fetch(item: int) -> str:
        """Fetch an item."""
        if item > 0 and first_run[0]:
            time.sleep(0.05)  # (call 0 is recorded by then)
            raise Boom()
        time.sleep(0.01 * item)
        return f"item {item}"

    ledger = KeyOrder(InMemoryCheckpointer())
    app: Any = fetch_agent(ledger, fetch, 3)
    config = {"configurable": {"thread_id": "t"}}
    with pytest.raises(Boom):
        app.invoke({"messages": [HumanMessage("go")]}, config, durability="sync")
    assert any(k.endswith(":c0") for keys in ledger.keys for k in keys)
    first_run[0] = False
    ledger.keys.clear()
    remove = set_completion_order(lambda calls: [0, 1, 2])
    started = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING):
            app.invoke(None, {**config, "max_concurrency": 1}, durability="sync")
    finally:
        remove()
    assert time.monotonic() - started < 2.5  # (a lost order would hold the siblings 5 s for call 0)
    assert "did not come in" not in caplog.text
    written = [k.split(":")[-1] for keys in ledger.keys for k in keys]
    assert written == ["c1", "c2"]


def test_under_ainvoke_too_the_harness_order_holds_for_replay_safe_tool_node() -> None:
    """``ainvoke``: LangGraph runs the calls as coroutines on the caller's loop (``awrap_tool_call``); they pass
    from return to record in the harness's order all the same (call 0 returns first, the order puts it last)."""
    pytest.importorskip("langgraph")
    from langchain_core.messages import HumanMessage

    from tenxgraph.core.graph.utils.instrument import set_completion_order
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    async def fetch(item: int) -> str:
        """Fetch an item."""
        await asyncio.sleep(0.02 * item)
        return f"item {item}"

    ledger = KeyOrder(InMemoryCheckpointer())
    app: Any = fetch_agent(ledger, fetch, 3)
    remove = set_completion_order(lambda calls: [2, 1, 0])
    try:
        config = {"configurable": {"thread_id": "t"}}
        asyncio.run(app.ainvoke({"messages": [HumanMessage("go")]}, config, durability="sync"))
    finally:
        remove()
    assert [k.split(":")[-1] for keys in ledger.keys for k in keys] == ["c2", "c1", "c0"]


def test_a_batch_that_fails_leaves_no_call_error_unretrieved(caplog: pytest.LogCaptureFixture) -> None:
    """Two calls fail at once: the first error is raised with the other noted on it, and asyncio has nothing to
    log as "never retrieved" when the tasks are collected (it would log from whatever thread collects them, and
    a traceback formatted in another thread while pytest formats one trips CPython 3.11's AST depth check)."""
    import gc
    import logging

    from tenxgraph.core.graph.utils.record_batch import gather_calls
    from tenxgraph.utils.sync import run_sync

    async def fails(message: str) -> None:
        raise RuntimeError(message)

    async def main() -> None:
        jobs = [asyncio.ensure_future(fails("first")), asyncio.ensure_future(fails("second"))]
        with pytest.raises(RuntimeError, match="first") as raised:
            await gather_calls(jobs)
        assert raised.value.__notes__ == ["another call of the batch failed too: RuntimeError: second"]

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        run_sync(main())
        gc.collect()
    assert "never retrieved" not in caplog.text
