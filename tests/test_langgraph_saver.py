"""``CrashPointSaver``: LangGraph's own crash points (``langgraph.*``) in a user's tests (#56). Armed the way every
crash point is (``TENXGRAPH_CRASH_AT`` in a child process, ``crashpoints.armed`` in-process), a point fires in the
wrapper around LangGraph's own savers, and never without it. The tools count their runs in their bodies (in a file,
across the killed process and its resume)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="the langgraph extra is not installed: pip install 'tenxgraph[langgraph]'")

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from tenxgraph.core import crashpoints
from tenxgraph.integrations.langgraph import CrashPointSaver, ReplaySafeToolNode, resume
from tenxgraph.storage.checkpointer import SqliteCheckpointer
from tests.test_langgraph import CFG, Counted, build

ROOT = Path(__file__).resolve().parent.parent
INPUT = {"messages": [HumanMessage("go")]}
POINTS = ("langgraph.after_put_writes", "langgraph.before_put", "langgraph.after_put")


@pytest.fixture
def ledger(tmp_path: Path) -> Any:
    cp = SqliteCheckpointer(tmp_path / "ledger.db")
    yield cp
    cp.close()


@pytest.mark.parametrize("point", POINTS)
def test_an_armed_langgraph_point_fires_in_the_wrapper_and_the_resume_runs_nothing_twice(
    point: str, ledger: Any
) -> None:
    counted, saver = Counted(), CrashPointSaver(InMemorySaver())
    with crashpoints.counting() as hits:
        build(ReplaySafeToolNode(counted.tools(), ledger=ledger), saver).invoke(
            INPUT, {"configurable": {"thread_id": "count"}}, durability="sync"
        )
    assert hits[point] >= 2, hits  # every point is reached more than once in this run
    counted.runs.clear()
    with crashpoints.armed(point, hit=2), pytest.raises(crashpoints.CrashInjected) as crash:
        build(ReplaySafeToolNode(counted.tools(), ledger=ledger), saver).invoke(INPUT, CFG, durability="sync")
    assert (crash.value.point, crash.value.hit) == (point, 2)
    result = resume(build(ReplaySafeToolNode(counted.tools(), ledger=ledger), saver), INPUT, CFG, durability="sync")
    assert result["messages"][-1].content == "done"
    assert set(counted.runs.values()) == {1}, counted.runs


def test_langgraphs_own_saver_never_fires_them(ledger: Any) -> None:
    """The symptom the wrapper fixes: armed, the point is accepted, and a bare saver never reaches it."""
    counted = Counted()
    with crashpoints.armed("langgraph.before_put"), crashpoints.counting() as hits:
        result = build(ReplaySafeToolNode(counted.tools(), ledger=ledger), InMemorySaver()).invoke(
            INPUT, CFG, durability="sync"
        )
    assert result["messages"][-1].content == "done"
    assert not any(name.startswith("langgraph.") for name in hits), hits


def test_an_async_graph_fires_them_through_the_async_saver(ledger: Any) -> None:
    counted, saver = Counted(asynchronous=True), CrashPointSaver(InMemorySaver())

    async def scenario() -> dict[str, Any]:
        with crashpoints.armed("langgraph.after_put", hit=3), pytest.raises(crashpoints.CrashInjected):
            app = build(ReplaySafeToolNode(counted.tools(), ledger=ledger), saver)
            await app.ainvoke(INPUT, CFG, durability="sync")
        app = build(ReplaySafeToolNode(counted.tools(), ledger=ledger), saver)
        result: dict[str, Any] = await app.ainvoke(None, CFG, durability="sync")
        return result

    result = asyncio.run(scenario())
    assert result["messages"][-1].content == "done"
    assert set(counted.runs.values()) == {1}, counted.runs


CHILD = """
    import sqlite3, sys
    from pathlib import Path
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from tenxgraph.integrations.langgraph import CrashPointSaver, ReplaySafeToolNode, resume
    from tenxgraph.storage.checkpointer import SqliteCheckpointer
    from tests.test_langgraph import CFG, Counted, build

    work, wrapped = Path(sys.argv[1]), sys.argv[2] == "wrapped"

    class Logged(Counted):  # each run of a tool's body, appended to a file that outlives the process
        def __init__(self) -> None:
            super().__init__()
            self.runs = Log()

    class Log(dict):
        def __missing__(self, key):
            return 0
        def __setitem__(self, key, value):
            with open(work / "effects.log", "a") as f:
                f.write(key + "\\n")

    saver = SqliteSaver(sqlite3.connect(work / "langgraph.db", check_same_thread=False))
    app = build(ReplaySafeToolNode(Logged().tools(), ledger=SqliteCheckpointer(work / "ledger.db")),
                CrashPointSaver(saver) if wrapped else saver)
    result = resume(app, {"messages": [HumanMessage("go")]}, CFG, durability="sync")
    print(result["messages"][-1].content)
"""


#: The child's tool bodies, as its effects log names them: the first turn's three calls, then the next turn's.
FIRST_TURN, NEXT_TURN = {"refund:A", "email:ada", "refund:B"}, "refund:C"


def run_child(work: Path, wrapped: bool, crash_at: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != crashpoints.ENV_CRASH_AT}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src"), env.get("PYTHONPATH", "")])
    if crash_at:
        env[crashpoints.ENV_CRASH_AT] = crash_at
    script = textwrap.dedent(CHILD)
    argv = [sys.executable, "-c", script, str(work), "wrapped" if wrapped else "bare"]
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_tenxgraph_crash_at_kills_a_process_at_a_langgraph_point_of_sqlite_saver(tmp_path: Path) -> None:
    """A user's own kill test: ``TENXGRAPH_CRASH_AT=langgraph.after_put_writes:3:kill`` kills the child (SIGKILL)
    once the tool node's writes are saved (the input's and the model's came first); a plain resume finishes the
    run, and the first turn's calls, recorded before the kill, ran once each. LangGraph saves those writes in a
    background thread while the next steps run: the next turn's call may have run before the kill landed, and then
    runs again (its record was not written: the race docs/langgraph.md describes at langgraph.late_put_writes)."""
    killed = run_child(tmp_path, wrapped=True, crash_at="langgraph.after_put_writes:3:kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = (tmp_path / "effects.log").read_text().split()
    assert set(before[:3]) == FIRST_TURN and before[3:] in ([], [NEXT_TURN]), before
    resumed = run_child(tmp_path, wrapped=True, crash_at=None)
    assert resumed.returncode == 0 and resumed.stdout.strip() == "done", resumed.stderr
    effects = (tmp_path / "effects.log").read_text().split()
    assert all(effects.count(e) == 1 for e in FIRST_TURN) and set(effects) == FIRST_TURN | {NEXT_TURN}, effects
    assert effects.count(NEXT_TURN) == 1 + len(before[3:]), effects  # (again only if it had run before the kill)


def test_tenxgraph_crash_at_never_fires_without_the_wrapper(tmp_path: Path) -> None:
    bare = run_child(tmp_path, wrapped=False, crash_at="langgraph.after_put_writes:3:kill")
    assert bare.returncode == 0 and bare.stdout.strip() == "done", bare.stderr


def test_the_wrapper_refuses_what_is_not_a_saver_and_keeps_itself_under_an_allowlist() -> None:
    with pytest.raises(TypeError, match="is not a LangGraph saver"):
        CrashPointSaver(object())  # type: ignore[arg-type]
    saver = CrashPointSaver(InMemorySaver())
    assert isinstance(saver.with_allowlist([("tests", "Thing")]), CrashPointSaver)
