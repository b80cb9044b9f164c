"""CrashRun: run a test's agent clean, then crash it at every hit of the cell's point, resume it, and judge.

Modes:
- ``inprocess``: the crash raises ``CrashInjected``; the run resumes in the same process with a new graph object.
- ``sigkill``: a forked child (warm: it shares the parent's imports and objects) runs the agent and is killed with
  SIGKILL at the point, after writing an fsynced marker; the parent, a different process, resumes the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_replaysafe.checker import FAILING, CellResult, ExecutionLog, HitEvidence, result_problems, verdict
from pytest_replaysafe.effects import Effects
from pytest_replaysafe.gaps import GapRule, point_gap
from pytest_replaysafe.matrix import CONCURRENT_RESUMERS, Cell
from tenxgraph.core import crashpoints
from tenxgraph.core.crashpoints import CrashInjected, InjectedFault
from tenxgraph.core.graph.compiled import CompiledGraph, RunResult
from tenxgraph.core.graph.utils.invoke_node_handler import add_tool_observer, current_tool_call
from tenxgraph.errors import ThreadBusyError
from tenxgraph.storage.checkpointer.base import BaseCheckpointer

Inputs = Mapping[str, Any] | list[Mapping[str, Any]]
"""One input, or the turns of a conversation."""
CHILD_TIMEOUT_S = 120.0
"""A forked child that has not finished by then is killed and its cell reported as an error (never a hang)."""
_CHILD_DONE = 3  # the child finished its run: the point was not reached
_CHILD_FAILED = 4


def fork_child(body: Callable[[], int], failure: Path) -> int:
    """Fork; the child runs *body* and exits with its code (never returning into pytest), writing its traceback
    to *failure* if it raises. Returns the child's pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = _CHILD_FAILED
        try:
            code = body()
        except BaseException:
            failure.write_text(traceback.format_exc())
        finally:
            os._exit(code)
    return pid


def wait_child(pid: int, timeout: float = CHILD_TIMEOUT_S) -> int | None:
    """``waitpid`` with a deadline: the wait status, or None if the child had to be killed for overrunning it."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


class ReplaySafetyViolation(AssertionError):
    """A cell found a duplicate, a lost or extra tool result, or a failed resume."""


class CrashRun:
    """The ``crash_run`` fixture: owns the checkpointer, thread ids, execution counts, crashes and checks."""

    def __init__(
        self,
        *,
        nodeid: str,
        cell: Cell | None,
        checkpointer: BaseCheckpointer,
        workdir: Path,
        seed: int,
        rules: tuple[GapRule, ...],
        tools: list[str] | None = None,
        hits: set[int] | None = None,
        effects: Effects | None = None,
    ) -> None:
        self.nodeid = nodeid
        self.cell = cell
        self.checkpointer = checkpointer
        self.workdir = workdir
        self.seed = seed
        self.rules = rules
        self.tools = tools
        self.hits = hits
        self.effects = effects
        self.log = ExecutionLog(workdir / "executions.jsonl")
        self.results: list[CellResult] = []
        #: Set when the cell showed a known gap: the test is reported as xfailed (if its own assertions pass).
        self.gap_message: str | None = None
        #: Set when a gap-table point did not duplicate: the test is reported as failed (strict).
        self.missing_gap: str | None = None
        self._rng = random.Random(f"{seed}:{nodeid}")
        self.thread_id = self._new_thread("main")

    def _new_thread(self, label: str) -> str:
        return f"rs-{self._rng.getrandbits(48):012x}-{label}"

    # -- public API -------------------------------------------------------------------------------------
    def invoke(
        self, app: CompiledGraph[Any], input: Mapping[str, Any], config: Mapping[str, Any] | None = None
    ) -> RunResult[Any]:
        """Run *app* on *input* (clean; or, in a matrix cell, crashed and resumed at every hit) and check it."""
        return self._drive(app, input, dict(config or {}), stream=False)

    def stream(
        self, app: CompiledGraph[Any], input: Mapping[str, Any], config: Mapping[str, Any] | None = None
    ) -> RunResult[Any]:
        """Like :meth:`invoke`, driving every run through ``stream`` (the same ledger path as ``invoke``)."""
        return self._drive(app, input, dict(config or {}), stream=True)

    def conversation(
        self, app: CompiledGraph[Any], turns: Sequence[Mapping[str, Any]], config: Mapping[str, Any] | None = None
    ) -> RunResult[Any]:
        """Several user turns on one thread; hits count across all turns. Resuming re-sends every turn: inputs
        already stored are skipped and an interrupted run is finished first, so each turn runs exactly once."""
        if not turns:
            raise pytest.UsageError("crash_run.conversation needs at least one turn")
        return self._drive(app, list(turns), dict(config or {}), stream=False)

    def executions(self, thread_id: str | None = None) -> dict[str, int]:
        """Real executions of tool bodies per ledger key on a thread (default: the main thread)."""
        counts, _ = self.log.history(thread_id or self.thread_id, self.tools)
        return dict(counts)

    # -- internals --------------------------------------------------------------------------------------
    def _run(
        self,
        app: CompiledGraph[Any],
        input: Inputs | None,
        thread: str,
        config: dict[str, Any],
        stream: bool,
    ) -> RunResult[Any]:
        graph = app.copy(self.checkpointer)  # a new graph object every run
        cfg = {**config, "thread_id": thread}
        result = None
        for turn in input if isinstance(input, list) else [input]:
            if not stream:
                result = graph.invoke(turn, cfg)
                continue
            for event in graph.stream(turn, cfg):
                result = event.result or result
        assert result is not None
        return result

    def _drive(self, app: CompiledGraph[Any], input: Inputs, config: dict[str, Any], stream: bool) -> RunResult[Any]:
        if config.pop("thread_id", None) is not None:
            raise pytest.UsageError("crash_run.invoke: leave thread_id out of config; crash_run assigns thread ids")
        remove = add_tool_observer(self.log.observe)
        try:
            if self.cell is None:
                return self._clean_only(app, input, config, stream)
            return self._matrix(app, input, config, stream)
        finally:
            remove()

    def _clean_only(
        self, app: CompiledGraph[Any], input: Inputs, config: dict[str, Any], stream: bool
    ) -> RunResult[Any]:
        result = self._run(app, input, self.thread_id, config, stream)
        problems = result_problems(result.messages)
        problems += [
            f"{eid} executed {n} times in a run without crash" for eid, n in self.executions().items() if n > 1
        ]
        if problems:
            raise ReplaySafetyViolation("; ".join(problems))
        return result

    def _matrix(self, app: CompiledGraph[Any], input: Inputs, config: dict[str, Any], stream: bool) -> RunResult[Any]:
        assert self.cell is not None
        cell = self.cell
        stream = stream or cell.mode == "stream"
        clean_thread = self._new_thread("clean")
        with crashpoints.counting() as counts:
            clean = self._run(app, input, clean_thread, config, stream)
        reached = counts.get(cell.point, 0)
        self.thread_id = clean_thread
        if reached == 0:
            self._record(0, "vacuous", None, {}, 0.0, f"{cell.point} was never reached by a clean run of this test")
        last: RunResult[Any] = clean
        for hit in range(1, reached + 1):
            if self.hits is not None and hit not in self.hits:
                continue
            started = time.perf_counter()
            thread = self._new_thread(f"hit{hit}")
            evidence, resumed = self._crash_and_resume(app, input, config, stream, hit, thread, clean.final_text)
            outcome, gap, detail = verdict(evidence, self.rules, cell.point, cell.mode, cell.backend)
            self._record(hit, outcome, gap, dict(evidence.executions), time.perf_counter() - started, detail)
            if self.effects is not None:
                applied = self.effects.applied(thread_id=thread)
                self.results[-1].effects_applied = dict(Counter(e["kind"] for e in applied))
            last = resumed or last
            self.thread_id = thread
        self._conclude()
        return last

    def _record(
        self, hit: int, outcome: str, gap: str | None, executions: dict[str, int], duration: float, detail: str
    ) -> None:
        assert self.cell is not None
        repro = f"pytest '{self.nodeid}' --crash-matrix --crash-seed={self.seed}" + (
            f" --crash-hits={hit}" if hit else ""
        )
        self.results.append(
            CellResult(
                self.nodeid,
                self.cell.point,
                hit,
                self.cell.backend,
                self.cell.mode,
                outcome,
                gap,
                executions,
                round(duration, 4),
                repro,
                detail,
            )
        )

    def _conclude(self) -> None:
        """Fail now on a violation; known gaps (and a strict gap that did not show) are applied to the test's
        report after the test body finished, so the test's own assertions still run in every cell."""
        failing = [r for r in self.results if r.outcome in FAILING]
        if failing:
            lines = [f"hit {r.hit}: {r.outcome.upper()}: {r.detail}\n    repro: {r.repro}" for r in failing]
            raise ReplaySafetyViolation("replay safety is broken in this cell:\n" + "\n".join(lines))
        assert self.cell is not None
        gaps = [r for r in self.results if r.outcome == "known_gap"]
        if gaps:
            names = sorted({name for g in gaps for name in (g.gap or "").split(",")})
            self.gap_message = f"known gap {', '.join(names)} at hit(s) {', '.join(str(g.hit) for g in gaps)}"
        expected = point_gap(self.rules, self.cell.point, self.cell.mode, self.cell.backend)
        handled = any(r.outcome == "in_doubt_handled" for r in self.results)  # the tool closed the gap itself
        if expected is not None and not handled and not any(g.gap and expected.name in g.gap.split(",") for g in gaps):
            self.missing_gap = (
                f"[XPASS(strict)] known gap {expected.name} was expected at {self.cell.point} but no call was "
                f"executed twice: if the gap is closed, update the gap table (pytest_replaysafe.gaps)"
            )

    # -- arming -----------------------------------------------------------------------------------------
    def _arm_first_run(self, hit: int, window: dict[str, str], crash: Callable[[str, int], None]) -> None:
        """Arm the cell's point for the run that crashes. Fault points fail once, then the node's end crashes."""
        assert self.cell is not None
        point = self.cell.point

        def capture_then(action: Callable[[str, int], None]) -> Callable[[str, int], None]:
            def fire(name: str, n: int) -> None:
                call = current_tool_call()
                window.setdefault("id", call.execution_id if call else "*")
                action(name, n)

            return fire

        if point == "ledger.read_error":
            # Let this read succeed and the node record its calls; crash at the node's end; the resume's read fails.
            window["id"] = "*"
            crashpoints.arm(point, hit, lambda name, n: crashpoints.arm("node.after_complete", 1, crash))
        elif crashpoints.get_crash_point(point).kind == "fault":

            def fault_then_crash(name: str, n: int) -> None:
                crashpoints.arm("node.after_complete", 1, crash)
                raise InjectedFault(name, n)

            crashpoints.arm(point, hit, capture_then(fault_then_crash))
        else:
            crashpoints.arm(point, hit, capture_then(crash))

    def _arm_resume(self) -> None:
        assert self.cell is not None
        if self.cell.point == "ledger.read_error":
            crashpoints.arm("ledger.read_error", 1, "fault")

    # -- one hit ----------------------------------------------------------------------------------------
    def _crash_and_resume(
        self,
        app: CompiledGraph[Any],
        input: Inputs,
        config: dict[str, Any],
        stream: bool,
        hit: int,
        thread: str,
        clean_text: str,
    ) -> tuple[HitEvidence, RunResult[Any] | None]:
        assert self.cell is not None
        if self.cell.mode == "sigkill":
            crashed, window, error = self._crash_in_child(app, input, config, stream, hit, thread)
        else:
            crashed, window, error = self._crash_in_process(app, input, config, stream, hit, thread)
        unfinished = self.log.unfinished(thread) if crashed else {}
        evidence = HitEvidence(
            crashed, window, *self.log.history(thread, self.tools, unfinished), None, None, clean_text, error=error
        )
        if error or not crashed:
            return evidence, None
        try:
            self._arm_resume()
            if self.cell.mode == "concurrent":
                self._resume_concurrently(app, input, config, thread)
            result = self._run(app, input if isinstance(input, list) else None, thread, config, stream)
        except Exception as exc:
            evidence.resume_error = f"{type(exc).__name__}: {exc}"
            return evidence, None
        finally:
            crashpoints.reset()
        evidence.executions, evidence.conditions = self.log.history(thread, self.tools, unfinished)
        evidence.final_messages, evidence.final_text = result.messages, result.final_text
        evidence.in_doubt_handled = self.log.handled_in_doubt(thread)
        return evidence, result

    def _crash_in_process(
        self,
        app: CompiledGraph[Any],
        input: Inputs,
        config: dict[str, Any],
        stream: bool,
        hit: int,
        thread: str,
    ) -> tuple[bool, str | None, str | None]:
        window: dict[str, str] = {}

        def crash(name: str, n: int) -> None:
            raise CrashInjected(name, n)

        crashpoints.reset()
        try:
            self._arm_first_run(hit, window, crash)
            self._run(app, input, thread, config, stream)
            return False, None, None
        except CrashInjected:
            return True, window.get("id"), None
        except Exception as exc:
            return False, None, f"the crashing run failed before its crash: {type(exc).__name__}: {exc}"
        finally:
            crashpoints.reset()

    def _resume_concurrently(self, app: CompiledGraph[Any], input: Inputs, config: dict[str, Any], thread: str) -> None:
        """Several forked processes resume the thread at the same moment; each must finish the run or stop with
        ThreadBusyError before doing anything. Anything else is raised as a failed resume."""
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        barrier = ctx.Barrier(CONCURRENT_RESUMERS)
        resume_input = input if isinstance(input, list) else None
        failures = [self.workdir / f"{thread}.resumer{i}.error" for i in range(CONCURRENT_RESUMERS)]

        def resume() -> int:
            barrier.wait(timeout=30)
            with contextlib.suppress(ThreadBusyError):  # another resumer holds the thread: a fair loss
                self._run(app, resume_input, thread, config, False)
            return 0

        pids = [fork_child(resume, failure) for failure in failures]
        problems = []
        for pid, failure in zip(pids, failures, strict=True):
            status = wait_child(pid)
            if status is None:
                problems.append(f"a resumer did not finish within {CHILD_TIMEOUT_S:g}s and was killed (hung?)")
            elif not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
                problems.append(failure.read_text() if failure.exists() else f"wait status {status}")
        if problems:
            raise RuntimeError(f"{len(problems)} of {CONCURRENT_RESUMERS} concurrent resumers failed:\n{problems[0]}")

    def _crash_in_child(
        self,
        app: CompiledGraph[Any],
        input: Inputs,
        config: dict[str, Any],
        stream: bool,
        hit: int,
        thread: str,
    ) -> tuple[bool, str | None, str | None]:
        marker = self.workdir / f"{thread}.marker"
        failure = self.workdir / f"{thread}.error"

        def crash_run() -> int:
            window: dict[str, str] = {}

            def kill(name: str, n: int) -> None:
                payload = json.dumps({"point": name, "hit": n, "window": window.get("id")}).encode()
                fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.write(fd, payload)
                os.fsync(fd)
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)

            crashpoints.reset()
            self._arm_first_run(hit, window, kill)
            self._run(app, input, thread, config, stream)
            return _CHILD_DONE

        pid = fork_child(crash_run, failure)
        status = wait_child(pid)
        if status is None:
            return False, None, f"the child did not reach its crash within {CHILD_TIMEOUT_S:g}s and was killed (hung?)"
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
            try:
                data = json.loads(marker.read_text())
            except (OSError, ValueError):
                return False, None, "the child was killed by SIGKILL without writing its crash marker"
            return True, data.get("window"), None
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == _CHILD_DONE:
            return False, None, None
        detail = failure.read_text() if failure.exists() else f"wait status {status}"
        return False, None, f"the child process failed before its crash:\n{detail}"
