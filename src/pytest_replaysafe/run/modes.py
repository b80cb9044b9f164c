"""One strategy per crash-matrix mode: how a hit's run is crashed, and how it is resumed.

- ``inprocess``: the crash raises ``CrashInjected``; the run resumes in the same process with a new graph object.
- ``stream``: ``inprocess`` with both runs driven through ``stream``.
- ``sigkill``: a forked child (warm: it shares the parent's imports and objects) runs the agent and is killed with
  SIGKILL at the point, after writing an fsynced marker; the parent, a different process, resumes once the child
  is reaped, waiting (``lock_timeout``) for the database to free the dead child's run lock.

The modes whose resume is more than one run of the app (``concurrent``, ``recovery``, ``prune``) are in
:mod:`pytest_replaysafe.run.resumes`, which holds the table of every mode (``MODES``).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from pytest_replaysafe.judge.evidence import call_id_of
from pytest_replaysafe.run.procs import CHILD_DONE, HarnessError, child_timeout, describe_status, fork_child, wait_child
from pytest_replaysafe.run.settle import settle_siblings

if TYPE_CHECKING:
    from pytest_replaysafe.run.langgraph_app import LangGraphApp
    from pytest_replaysafe.run.loop_app import LoopApp
    from pytest_replaysafe.run.pydantic_ai_app import PydanticAIApp
    from pytest_replaysafe.run.spy import RecordingCheckpointer
    from tenxgraph.core.graph.compiled import CompiledGraph, RunResult

Inputs = Mapping[str, Any] | list[Mapping[str, Any]]
"""One input, or the turns of a conversation."""
App: TypeAlias = "CompiledGraph[Any] | LangGraphApp | PydanticAIApp | LoopApp"
"""What a cell runs: a tenxgraph graph, a LangGraph app (see :mod:`.langgraph_app`), a Pydantic AI agent
(:mod:`.pydantic_ai_app`) or a plain loop (:mod:`.loop_app`)."""


class Runner(Protocol):
    """What a mode needs from the harness (:class:`~.driver.CellDriver` is one)."""

    workdir: Path
    checkpointer: RecordingCheckpointer

    def run_graph(
        self,
        app: App,
        input: Inputs | None,
        thread: str,
        config: dict[str, Any],
        stream: bool,
        label: str,
    ) -> RunResult[Any]: ...

    def stored_result(self, app: App, thread: str) -> RunResult[Any]: ...


#: How long a resume waits for the crashed run's lock (PostgreSQL frees a killed session's lock a little later).
RESUME_LOCK_TIMEOUT_S = 30.0


@dataclass
class Hit:
    """One hit of one drive: what to run, where it crashes, and what was seen."""

    app: App
    input: Inputs | None  # None: resume the thread (a second crash happens during a resume)
    config: dict[str, Any]
    stream: bool
    point: str
    #: The crash fires at the point's arrival with this number (the cell's hit).
    arrival: int
    thread: str
    contest: list[str] = field(default_factory=list)
    #: ``concurrent``: where the lock holder pauses while the others contest the thread (point, its arrival in
    #: the resume); whether it got there (None: not a contest).
    window: tuple[str, int] = ("run.before_node", 1)
    contested_window: str | None = None  # the window's name (``release`` pauses at the last node.after_complete)
    contested: bool | None = None
    #: A resume that stopped by design and was resumed again (its reason): a failed ledger read with calls of
    #: tools that have an in-doubt policy (``LedgerReadError``).
    stopped: str | None = None
    #: A LangGraph app. Its threads outlive an in-process crash (LangGraph runs sync tools in a thread pool, which
    #: the crash does not stop): after the crash, every point they reach crashes too, as in a process that died.
    langgraph: str = ""  # a LangGraph app's: its durability ("sync", "async"); "" for ours
    #: What the app is built with, as the test's marker says (``tenxgraph``, ``langgraph``, ``pydantic_ai``).
    framework: str = "tenxgraph"

    @property
    def outlives(self) -> bool:
        """Another framework's app (LangGraph, Pydantic AI): its tool threads outlive an in-process crash."""
        return self.framework != "tenxgraph" or bool(self.langgraph)

    @property
    def resume_input(self) -> Inputs | None:
        return self.input if isinstance(self.input, list) else None

    @property
    def resume_config(self) -> dict[str, Any]:
        return {"lock_timeout": RESUME_LOCK_TIMEOUT_S, **self.config}


@dataclass(frozen=True, slots=True)
class Crash:
    crashed: bool
    window: str | None = None  # execution id of the call the crash hit, "*" for the whole node
    error: str | None = None
    note: str | None = None  # what a fault did (for the timeline)
    result: Any = None  # a fault the run survived: its finished run (no resume)
    at: float | None = None  # a fault: when it was injected (CLOCK_MONOTONIC, as the execution log's times)


class Mode(Protocol):
    name: str
    other_process: bool  # the resume runs in another process: needs durable storage

    def crash(self, run: Runner, hit: Hit) -> Crash: ...

    def resume(self, run: Runner, hit: Hit) -> RunResult[Any]: ...


def arm_crash(
    point: str,
    hit: int,
    window: dict[str, str],
    crash: Callable[[str, int], None],
    settle: Callable[[], None] | None = None,
) -> None:
    """Arm *point* for the run that crashes. A fault point fails once, then the node's end crashes; for
    ``ledger.read_error`` the read succeeds, the node's end crashes, and the resume's read fails. *settle*: called
    before a crash inside a tool call, to let its siblings come to rest (:mod:`.settle`)."""
    from tenxgraph.core import crashpoints
    from tenxgraph.core.crashpoints import InjectedFault
    from tenxgraph.core.tools.context import current_tool_call

    def capture_then(action: Callable[[str, int], None]) -> Callable[[str, int], None]:
        def fire(name: str, n: int) -> None:
            call = current_tool_call()
            window.setdefault("id", call_id_of(call.message_id, call.index) if call else "*")
            if call is not None and settle is not None:
                settle()
            action(name, n)

        return fire

    if point == "langgraph.late_put_writes":  # (a LangGraph race: the kill waits for a later call's return)
        from pytest_replaysafe.run.langgraph_race import late_kill

        crashpoints.arm(point, hit, late_kill(crash, window, settle))
    elif point == "ledger.read_error":
        window["id"] = "*"
        crashpoints.arm(point, hit, lambda name, n: crashpoints.arm("node.after_complete", 1, crash))
    elif crashpoints.get_crash_point(point).kind == "fault":

        def fault_then_crash(name: str, n: int) -> None:
            crashpoints.arm("node.after_complete", 1, crash)
            raise InjectedFault(name, n)

        crashpoints.arm(point, hit, capture_then(fault_then_crash))
    else:
        crashpoints.arm(point, hit, capture_then(crash))


def arm_resume(point: str) -> None:
    from tenxgraph.core import crashpoints

    if point == "ledger.read_error":
        crashpoints.arm("ledger.read_error", 1, "fault")


class InProcess:
    name = "inprocess"
    other_process = False
    stream = False

    def crash(self, run: Runner, hit: Hit) -> Crash:
        from tenxgraph.core import crashpoints
        from tenxgraph.core.crashpoints import CrashInjected

        window: dict[str, str] = {}

        def crash(name: str, n: int) -> None:
            if hit.outlives:
                for point in crashpoints.list_crash_points("crash"):
                    crashpoints.arm(point.name, 1, "raise")
            raise CrashInjected(name, n)

        crashpoints.reset()
        try:
            arm_crash(hit.point, hit.arrival, window, crash, lambda: settle_siblings(run.checkpointer))
            run.run_graph(hit.app, hit.input, hit.thread, hit.config, hit.stream, "crash")
            return Crash(False)
        except CrashInjected:
            return Crash(True, window.get("id"))
        except Exception as exc:
            return Crash(False, error=f"the crashing run failed before its crash: {type(exc).__name__}: {exc}")
        finally:
            crashpoints.reset()

    def resume(self, run: Runner, hit: Hit) -> RunResult[Any]:
        from tenxgraph.core import crashpoints
        from tenxgraph.utils.errors import LedgerReadError

        try:
            arm_resume(hit.point)
            try:
                return run.run_graph(hit.app, hit.resume_input, hit.thread, hit.resume_config, hit.stream, "resume")
            except LedgerReadError as exc:  # by design: nothing ran, the thread stays resumable
                if hit.point != "ledger.read_error" or hit.stopped is not None:
                    raise
                hit.stopped = f"{type(exc).__name__}: {exc}"
                crashpoints.reset()
                return run.run_graph(hit.app, hit.resume_input, hit.thread, hit.resume_config, hit.stream, "resume")
        finally:
            crashpoints.reset()


class Stream(InProcess):
    name = "stream"
    stream = True


class SigKill(InProcess):
    name = "sigkill"
    other_process = True

    def crash(self, run: Runner, hit: Hit) -> Crash:
        from tenxgraph.core import crashpoints

        marker = run.workdir / f"{hit.thread}.marker"
        failure = run.workdir / f"{hit.thread}.error"

        def child() -> int:
            window: dict[str, str] = {}

            def kill(name: str, n: int) -> None:
                payload = json.dumps({"point": name, "hit": n, "window": window.get("id")}).encode()
                fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.write(fd, payload)  # (no fsync: the file must outlive the process, not the machine)
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)

            crashpoints.reset()
            arm_crash(hit.point, hit.arrival, window, kill, lambda: settle_siblings(run.checkpointer))
            run.run_graph(hit.app, hit.input, hit.thread, hit.config, hit.stream, "crash")
            return CHILD_DONE

        try:
            pid = fork_child(child, failure)
        except HarnessError as exc:
            return Crash(False, error=str(exc))
        status = wait_child(pid)
        if status is None:
            return Crash(False, error=f"the child did not reach its crash within {child_timeout():g}s and was killed")
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
            try:
                data = json.loads(marker.read_text())
            except (OSError, ValueError):
                return Crash(False, error="the child was killed by SIGKILL without writing its crash marker")
            return Crash(True, data.get("window"))
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == CHILD_DONE:
            return Crash(False)
        return Crash(False, error=f"the child process failed before its crash:\n{describe_status(status, failure)}")
