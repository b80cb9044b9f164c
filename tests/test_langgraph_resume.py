"""``resume(app, input, config)``: the resume a LangGraph user writes, right whenever the crash came (#56). Before
the first checkpoint LangGraph's ``invoke(None)`` raises ``EmptyInputError``; after it, sending the input again
would add it twice. The tools count their runs in their bodies."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import EmptyInputError

from tenxgraph.core import crashpoints
from tenxgraph.integrations.langgraph import ReplaySafeToolNode, aresume, resume
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tests.test_langgraph import CFG, Counted, build

INPUT = {"messages": [HumanMessage("go")]}


class DiesBeforeTheFirstCheckpoint(InMemorySaver):
    """A saver whose process 'dies' at its first checkpoint write: nothing of the thread is saved."""

    def __init__(self) -> None:
        super().__init__()
        self.dead = True

    def put(self, *args: Any, **kwargs: Any) -> Any:
        if self.dead:
            self.dead = False
            raise crashpoints.CrashInjected("first checkpoint", 1)
        return super().put(*args, **kwargs)

    async def aput(self, *args: Any, **kwargs: Any) -> Any:
        return self.put(*args, **kwargs)


@pytest.fixture
def ledger(tmp_path: Path) -> Any:
    cp = SqliteCheckpointer(tmp_path / "ledger.db")
    yield cp
    cp.close()


def humans(result: dict[str, Any]) -> int:
    return sum(1 for m in result["messages"] if isinstance(m, HumanMessage))


def test_a_crash_before_the_first_checkpoint_is_resumed_with_the_input_again(ledger: Any) -> None:
    counted, saver = Counted(), DiesBeforeTheFirstCheckpoint()
    with pytest.raises(crashpoints.CrashInjected):
        build(ReplaySafeToolNode(counted.tools(), ledger=ledger), saver).invoke(INPUT, CFG, durability="sync")
    app = build(ReplaySafeToolNode(counted.tools(), ledger=ledger), saver)
    with pytest.raises(EmptyInputError):  # what the docs' old resume line met here
        app.invoke(None, CFG, durability="sync")
    result = resume(app, INPUT, CFG, durability="sync")
    assert result["messages"][-1].content == "done" and humans(result) == 1
    assert set(counted.runs.values()) == {1}, counted.runs


def test_a_crash_after_a_checkpoint_is_resumed_from_it_without_the_input(ledger: Any) -> None:
    counted, saver = Counted(), InMemorySaver()
    with crashpoints.armed("tool.after_record", hit=2), pytest.raises(crashpoints.CrashInjected):
        build(ReplaySafeToolNode(counted.tools(), ledger=ledger), saver).invoke(INPUT, CFG, durability="sync")
    result = resume(build(ReplaySafeToolNode(counted.tools(), ledger=ledger), saver), INPUT, CFG, durability="sync")
    assert result["messages"][-1].content == "done"
    assert humans(result) == 1  # (the input is not sent twice)
    assert set(counted.runs.values()) == {1}, counted.runs
    again = resume(build(ReplaySafeToolNode(counted.tools(), ledger=ledger), saver), INPUT, CFG, durability="sync")
    assert again["messages"] == result["messages"] and set(counted.runs.values()) == {1}  # finished: nothing runs


def test_the_async_resume_does_the_same(ledger: Any) -> None:
    counted, saver = Counted(asynchronous=True), DiesBeforeTheFirstCheckpoint()

    async def scenario() -> dict[str, Any]:
        with pytest.raises(crashpoints.CrashInjected):
            await build(ReplaySafeToolNode(counted.tools(), ledger=ledger), saver).ainvoke(
                INPUT, CFG, durability="sync"
            )
        app = build(ReplaySafeToolNode(counted.tools(), ledger=ledger), saver)
        result: dict[str, Any] = await aresume(app, INPUT, CFG, durability="sync")
        return result

    result = asyncio.run(scenario())
    assert result["messages"][-1].content == "done" and humans(result) == 1
    assert set(counted.runs.values()) == {1}, counted.runs
