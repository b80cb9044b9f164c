"""CrashRun, the ``crash_run`` fixture: the test author's API. Drive the agent through it (``invoke``, ``ainvoke``,
``stream``, ``conversation``) and read what ran (``executions``, ``entries``, ``thread_id``, ``checkpointer``)
and what this execution plays (``hit``, ``order``, ``cell``, ``seed``);
the cell's crashes, resumes and verdicts are the plugin's, in :class:`~.driver.CellDriver`.

The test body runs once per hit (the plugin calls it again for each): in each execution ``crash_run.invoke``
crashes at that hit, resumes, and returns the resumed result, and ``crash_run.thread_id`` is that hit's thread,
so the test's own assertions hold for every hit, not only the last."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_replaysafe.judge.evidence import Entry
from pytest_replaysafe.matrix.cells import Cell
from pytest_replaysafe.run.approvals import Approvals
from pytest_replaysafe.run.driver import CellDriver, CellPlan, ReplaySafetyViolation
from pytest_replaysafe.run.effects import Effects
from pytest_replaysafe.run.spy import RecordingCheckpointer
from tenxgraph.core.graph.compiled import CompiledGraph, RunResult
from tenxgraph.storage.checkpointer.base import BaseCheckpointer

__all__ = ["CellPlan", "CrashRun", "ReplaySafetyViolation"]


class CrashRun:
    """Runs the test's agent clean, or (in a matrix cell) crashed and resumed at each hit, and judges it."""

    def __init__(
        self,
        plan: CellPlan,
        checkpointer: BaseCheckpointer,
        workdir: Path,
        effects: Effects | None = None,
        approvals: Approvals | None = None,
    ) -> None:
        #: The plugin's side: the cell's schedule, crashes, resumes and verdicts.
        self.driver = CellDriver(plan, checkpointer, workdir, effects, approvals)

    @property
    def checkpointer(self) -> RecordingCheckpointer:
        """The cell's checkpointer (wrapped to log ledger writes): build your app over it."""
        return self.driver.checkpointer

    @property
    def langgraph_checkpointer(self) -> Any:
        """For a LangGraph app: the LangGraph saver to compile it with (``graph.compile(checkpointer=...)``), on the
        cell's backend (``InMemorySaver``, ``SqliteSaver``, ``PostgresSaver``), with crash points around its writes;
        opened by the harness, closed after the test. Needs the ``langgraph`` extra."""
        return self.driver.langgraph_checkpointer()

    @property
    def thread_id(self) -> str:
        """This execution's thread: the hit's (crashed and resumed), or the clean run's."""
        return self.driver.thread_id

    # -- what this execution plays (public since the first release; read-only) ------------------------------------
    @property
    def hit(self) -> int:
        """The hit this execution of the body crashes at (1 in a clean run): the *hit*-th arrival at the cell's
        point, as in the cell's id and repro line."""
        return self.driver.hit

    @property
    def order(self) -> int:
        """This execution's completion order (0: the calls' own order; see ``--crash-orders``)."""
        return self.driver.order

    @property
    def cell(self) -> Cell | None:
        """The matrix cell (point, hit range, backend, mode), or None in a plain run."""
        return self.driver.cell

    @property
    def seed(self) -> int:
        """The matrix's seed (``--crash-seed``)."""
        return self.driver.seed

    def invoke(
        self, app: CompiledGraph[Any] | Any, input: Mapping[str, Any], config: Mapping[str, Any] | None = None
    ) -> RunResult[Any]:
        """Run *app* on *input* (clean; or, in a matrix cell, crashed and resumed at this execution's hit), check
        it, and return the (resumed) result. With the ``approvals`` fixture, every pause (an approval,
        ``interrupt()``) is answered by it, and the runs that resume the thread are part of the drive. *app*: a
        tenxgraph graph, or a compiled LangGraph graph (its result's
        ``messages`` are then tenxgraph messages; ``config`` may hold ``durability``, passed to LangGraph)."""
        return self.driver.drive(app, input, config, stream=False)

    async def ainvoke(
        self, app: CompiledGraph[Any] | Any, input: Mapping[str, Any], config: Mapping[str, Any] | None = None
    ) -> RunResult[Any]:
        """:meth:`invoke` for async tests (the crash and resume run off the test's event loop)."""
        return await asyncio.to_thread(self.driver.drive, app, input, config, False)

    def stream(
        self, app: CompiledGraph[Any] | Any, input: Mapping[str, Any], config: Mapping[str, Any] | None = None
    ) -> RunResult[Any]:
        """Like :meth:`invoke`, driving every run through ``stream`` (the same ledger path as ``invoke``)."""
        return self.driver.drive(app, input, config, stream=True)

    def conversation(
        self, app: CompiledGraph[Any], turns: Sequence[Mapping[str, Any]], config: Mapping[str, Any] | None = None
    ) -> RunResult[Any]:
        """Several user turns on one thread; hits count across all turns. Resuming re-sends every turn: inputs
        already stored are skipped and an interrupted run is finished first, so each turn runs exactly once."""
        if not turns:
            raise pytest.UsageError("crash_run.conversation needs at least one turn")
        return self.driver.drive(app, list(turns), config, stream=False)

    def executions(self, thread_id: str | None = None) -> dict[str, int]:
        """Real executions of tool bodies per ledger key on a thread (default: this execution's hit thread)."""
        return self.driver.executions(thread_id)

    def entries(self, thread: str) -> list[Entry]:
        """The thread's execution log, limited to the marker's ``tools=`` (calls of other tools are not judged)."""
        return self.driver.entries(thread)
