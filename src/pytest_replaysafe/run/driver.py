"""The cell driver: what the plugin runs behind ``crash_run``. It runs a test's agent clean, then crashed and
resumed at a hit of the cell's point, and judges every hit; the plugin calls it between executions of the test
body (``planned_executions``, ``begin_execution``, ``body_failed``, ``conclude``), and one hit's schedule is played
by :mod:`.hitrun`, which calls it back for what a schedule needs.

The test body runs once per hit: ``crash_run.invoke`` crashes at that hit, resumes and returns the resumed result
(``crash_run.thread_id`` is that hit's thread), so the test's own assertions hold for every hit. (Past the
~350-line guide: one class drives a cell through every mode, hit, completion order and schedule; what it uses has
modules of its own: modes, faults, hitrun, schedules, orders, evidence, spy, verdict, timeline, exposure.)"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_replaysafe.judge import coverage
from pytest_replaysafe.judge.evidence import Entry, ExecutionLog, body_runs
from pytest_replaysafe.judge.exposure import windows
from pytest_replaysafe.judge.gaps import GAPS_DOC, GapRule, gap_reasons, point_gap, remedies_of, shown_rules
from pytest_replaysafe.judge.outcome import FAILING, CellResult, Outcome
from pytest_replaysafe.judge.verdict import Reference, call_labels, clean_run_problems, judge, reference
from pytest_replaysafe.matrix.cells import MODE_POINTS, Backend, Cell, reach_hint
from pytest_replaysafe.matrix.orders import Groups, Orders
from pytest_replaysafe.matrix.schedules import DEPTH_MODES, Depth, Plan, Planner, SecondCrash
from pytest_replaysafe.report import timeline
from pytest_replaysafe.run import langgraph_app, loop_app, pydantic_ai_app, witness
from pytest_replaysafe.run.approvals import Approvals, run_once
from pytest_replaysafe.run.effects import Effects
from pytest_replaysafe.run.faults import DEFAULT_FAULTS, FAULT_MODE_OBJECTS
from pytest_replaysafe.run.hitrun import play
from pytest_replaysafe.run.langgraph_app import LangGraphApp, crash_point_saver, is_langgraph_app, saver_factory
from pytest_replaysafe.run.loop_app import LoopApp
from pytest_replaysafe.run.modes import App, Hit, Inputs
from pytest_replaysafe.run.pydantic_ai_app import PydanticAIApp, is_pydantic_ai_agent
from pytest_replaysafe.run.resumers import at_once_on
from pytest_replaysafe.run.resumes import MODES, window_arrival
from pytest_replaysafe.run.spy import RecordingCheckpointer
from tenxgraph.core import crashpoints
from tenxgraph.core.graph.compiled import RunResult
from tenxgraph.core.tools.context import ToolCallInfo
from tenxgraph.storage.checkpointer.base import BaseCheckpointer
from tenxgraph.utils.instrument import Instrument, install

UNROUTED = (
    "the test never ran its agent through crash_run: drive runs with crash_run.invoke(app, input) (or ainvoke, "
    "stream, conversation); a direct app.invoke(...) is neither crashed nor checked"
)


class ReplaySafetyViolation(AssertionError):
    """A cell found a duplicate, a wrong, lost or extra tool result, a repeated effect, or a failed resume."""


@dataclass
class LearnedDrive:
    """What the first execution of the test body learned about one ``crash_run.invoke`` call: how often its clean
    run reached the cell's point, the reference to judge by, the clean result, and every point's count."""

    reached: int
    ref: Reference
    clean: RunResult[Any]
    counts: dict[str, int]  # how often the clean run reached each point


@dataclass(frozen=True)
class CellPlan:
    """What the plugin decided for one test item: its cell (None: a plain run, checked without crashes), the
    backend, the seed, the gap rules, the repro line, the marker's ``tools=``, and the hits, completion orders,
    depth, storage faults and replayed schedules the options ask for."""

    nodeid: str
    cell: Cell | None = None
    backend: Backend | None = None
    seed: int = 0
    rules: tuple[GapRule, ...] = ()
    repro: str = ""
    tools: list[str] | None = None
    hits: set[int] | None = None
    orders: Orders | None = None
    depth: Depth | None = None
    faults: frozenset[str] = DEFAULT_FAULTS
    replay: list[Plan] | None = None
    framework: str = "tenxgraph"  # the marker's: what the cells were expanded for


class CellDriver:
    """Owns the checkpointer (wrapped to log ledger writes), thread ids, crashes, resumes and verdicts of a cell."""

    def __init__(
        self,
        plan: CellPlan,
        checkpointer: BaseCheckpointer,
        workdir: Path,
        effects: Effects | None,
        approvals: Approvals | None = None,
    ) -> None:
        self.plan = plan
        self.nodeid, self.framework = plan.nodeid, plan.framework
        self.cell = plan.cell
        self.backend = plan.backend
        self.workdir = workdir
        self.seed = plan.seed
        self.rules = plan.rules
        self.repro_base = plan.repro
        self.tools = plan.tools
        self.effects = effects
        #: The person the harness plays: answers every pause of a run (None: a paused run is returned as it is).
        self.approvals = approvals
        #: ``double-resume``: every Resume twice; its resume, and a storage fault's, re-sends the last one sent.
        self.double_resume = plan.cell is not None and plan.cell.mode == "double-resume"
        self.resumers = plan.cell is not None and plan.cell.mode == "resumers"  # (each Resume from k at once)
        self.retry_resume = self.double_resume or (plan.cell is not None and plan.cell.mode in FAULT_MODE_OBJECTS)
        self.log = ExecutionLog(workdir / "executions.jsonl")
        self.checkpointer = RecordingCheckpointer(checkpointer, self.log)
        self.results: list[CellResult] = []
        #: Per tool, ``(in_flight_s, after_return_s)`` of each call in the clean runs (see :mod:`.exposure`).
        self.exposure: dict[str, list[tuple[float, float]]] = {}
        #: Set when the cell showed a known gap: the test is reported as xfailed (if its own assertions pass).
        self.gap_message: str | None = None
        #: Set when a gap-table point did not duplicate: the test is reported as failed (strict).
        self.missing_gap: str | None = None
        self.driven = False
        self.drives: list[LearnedDrive] = []
        self.hit: int = min(plan.hits) if plan.hits else 1
        self.orders = plan.orders or Orders()
        self.order = self.orders.variants(0)[0]  # this execution's completion order (see :mod:`.orders`)
        self.depth = plan.depth or Depth()
        self.planner = Planner(plan.seed, plan.nodeid, plan.hits, self.orders, self.depth)
        self.faults = plan.faults
        self.then: SecondCrash | None = None  # this execution's second crash, during the resume (depth 2)
        self.replay = plan.replay  # --crash-replay: exactly these (hit, order, second crash) schedules
        if plan.replay:
            self.hit, self.order, self.then = plan.replay[0]
        self._drive_index = 0
        self._excused = False
        self._execution_start = 0
        self._batches = 0
        self._order_label = ""
        self._rng = random.Random(f"{plan.seed}:{plan.nodeid}")
        self._prefix = ""  # the thread names' start (a Pydantic AI agent's)
        self.thread_id = self._new_thread("main")
        self._saver: Any = None  # the LangGraph saver, made on first use

    def langgraph_checkpointer(self) -> Any:
        """The cell's LangGraph saver, on the checkpointer's backend, with crash points (see :mod:`.langgraph_app`)."""
        if self._saver is None:
            self._saver = crash_point_saver(saver_factory(self.checkpointer.inner, self.workdir))
        return self._saver

    def close(self) -> None:
        """Close what the cell opened for its LangGraph saver."""
        if self._saver is not None:
            self._saver.close()

    def _new_thread(self, label: str) -> str:
        return f"{self._prefix}rs-{self._rng.getrandbits(48):012x}-{label}"

    # -- the test author's calls (through CrashRun) ---------------------------------------------------------------
    def drive(self, app: Any, input: Inputs, config: Mapping[str, Any] | None, stream: bool) -> RunResult[Any]:
        """One ``crash_run.invoke`` (or ``stream``, ``conversation``) of a tenxgraph graph or a LangGraph app:
        clean, or crashed and resumed at this execution's hit, checked; the (resumed) result."""
        config = dict(config or {})
        where = (self.nodeid, self.framework, self.cell is not None)
        if is_pydantic_ai_agent(app):
            agent = pydantic_ai_app.checked(app, input, self.log, self.workdir, where)
            return self._drive(agent, input, config, stream)
        if loop_app.is_loop(app):
            checked = loop_app.checked(app, input, config or stream, self.workdir, where, self.log)
            checked.double_resume = self.double_resume
            return self._drive(checked, input, {}, False)
        if not is_langgraph_app(app):
            return self._drive(app, input, config, stream)
        langgraph_app.framework_matches(self.nodeid, self.framework, self.cell is not None)
        durability = config.pop("durability", None)  # (LangGraph takes it as an argument of invoke, not config)
        if isinstance(input, list):
            raise pytest.UsageError("crash_run.conversation drives tenxgraph graphs; drive a LangGraph app by invoke")
        return self._drive(LangGraphApp(app, input, self.log, durability), input, config, stream)

    def executions(self, thread_id: str | None = None) -> dict[str, int]:
        """Real executions of tool bodies per ledger key on a thread (default: this execution's hit thread)."""
        return dict(body_runs(self.entries(thread_id or self.thread_id), by_key=True))

    def entries(self, thread: str) -> list[Entry]:
        """The thread's execution log, limited to the marker's ``tools=`` (calls of other tools are not judged)."""
        entries = self.log.entries(thread)
        if self.tools is None:
            return entries
        allowed = set(self.tools)
        return [e for e in entries if e.tool is None or e.tool in allowed]

    # -- the plugin's side ------------------------------------------------------------------------------
    def planned_executions(self) -> Iterator[Plan]:
        """``(hit, order, second crash)`` still to run after the first execution of the body (each gets one of
        its own; see :class:`.schedules.Planner`)."""
        if self.replay:
            yield from self.replay[1:]
            return
        if self.cell is None or self.cell.budget:
            return
        reached = max((d.reached for d in self.drives), default=0)
        second = self.cell.mode in DEPTH_MODES and crashpoints.get_crash_point(self.cell.point).kind == "crash"
        yield from self.planner.plans(reached, (self.hit, self.order), second, self._failing_schedules)

    def _failing_schedules(self) -> list[Plan]:
        return [(r.hit, r.order, SecondCrash.parse(r.then)) for r in self.results if r.then and r.outcome in FAILING]

    def begin_execution(self, hit: int, order: int = 0, then: SecondCrash | None = None) -> None:
        self.hit, self.order, self.then = hit, order, then
        self._drive_index = 0
        self._execution_start = len(self.results)

    def body_failed(self, exc: BaseException) -> None:
        """The test body raised in this execution: its hit's cells become ``failed`` (unless already worse)."""
        if self.cell is None:
            return
        detail = f"the test failed: {type(exc).__name__}: {exc}".strip()
        mine = self.results[self._execution_start :]  # the cells this execution of the body recorded
        if not mine:
            self._record(self.hit, Outcome.FAILED, None, {}, 0.0, detail)
        for r in mine:
            if r.outcome == Outcome.KNOWN_GAP:  # the assertion saw the documented re-run: say which, and the fix
                at = self._at_gap(r)
                r.outcome, r.detail = Outcome.FAILED, f"{detail}; {at}"
                exc.add_note(f"replaysafe: the test {at}")
            elif r.outcome not in FAILING:
                r.outcome, r.gap, r.detail = Outcome.FAILED, None, detail

    def _at_gap(self, r: CellResult) -> str:
        """A failure at a known gap: which gap, which call ran again (the gap cell's detail), the remedy, the docs."""
        shown = shown_rules(self.rules, r.point, r.gap or "", r.mode, r.backend)
        remedies = remedies_of(shown.values(), self.framework)
        fix = f" To close it, {remedies}." if remedies else ""
        why = "; ".join(r.gap_reasons.values())  # (set from the same rules when the cell was recorded)
        return f"failed at known gap {r.gap} ({r.point} hit {r.hit}: {why}): {r.detail}.{fix} See {GAPS_DOC}"

    def check_routed(self) -> None:
        if not self.driven:
            if self.cell is not None:
                self._record(0, Outcome.VACUOUS, None, {}, 0.0, UNROUTED)
            raise ReplaySafetyViolation(UNROUTED)

    def conclude(self) -> None:
        """After every execution: known gaps (and a strict gap that did not show) go into the test's report."""
        if self.cell is None:
            return
        gaps = [r for r in self.results if r.outcome == Outcome.KNOWN_GAP]
        if gaps:
            names = sorted({name for g in gaps for name in (g.gap or "").split(",")})
            hits = ", ".join(str(h) for h in sorted({g.hit for g in gaps}))
            orders = len({r.order for r in self.results})
            many = f" ({len(gaps)} cells over {orders} completion orders)" if orders > 1 else ""
            self.gap_message = f"known gap {', '.join(names)} at hit(s) {hits}{many}"
        expected = point_gap(self.rules, self.cell.point, self.cell.mode, self.cell.backend)
        if self.cell.mode in FAULT_MODE_OBJECTS or self.planner.hits:  # a fault is no crash; some hits prove no
            expected = None  # gap closed (--crash-hits: make demo's first hits, a repro)
        handled = self._excused or any(r.outcome == Outcome.IN_DOUBT_HANDLED for r in self.results)
        if expected is not None and not handled and not any(g.gap and expected.name in g.gap.split(",") for g in gaps):
            self.missing_gap = (
                f"[XPASS(strict)] known gap {expected.name} was expected at {self.cell.point} but no call was "
                f"executed twice: if the gap is closed, update the gap table (pytest_replaysafe.judge.gaps)"
            )

    # -- running ----------------------------------------------------------------------------------------
    def run_graph(
        self,
        app: App,
        input: Inputs | None,
        thread: str,
        config: dict[str, Any],
        stream: bool,
        label: str,
    ) -> RunResult[Any]:
        """One run (every turn of a conversation) on a new graph object over the cell's checkpointer."""
        self._batches, self._order_label = 0, label
        at_once = at_once_on(self.workdir, self.log, thread) if label == "resume" and self.resumers else None
        if isinstance(app, LangGraphApp | PydanticAIApp | LoopApp):
            assert not isinstance(input, list)
            return app.run(input, thread, config, stream, self.approvals, at_once)
        graph = app.copy(self.checkpointer)
        cfg = {**config, "thread_id": thread}
        result = None
        turns: list[Any] = list(input) if isinstance(input, list) else [input]
        if label == "resume" and self.approvals is not None and self.retry_resume:  # a cut-off Resume, again
            turns = [*self.approvals.resend(graph, thread, cfg, self.log, self.double_resume), *turns]
        for turn in turns:
            result = run_once(graph, turn, cfg, stream)
            if self.approvals is not None:  # a pause: the harness's person answers, until the run ends
                result = self.approvals.settle(graph, result, cfg, stream, self.log, self.double_resume, at_once)
        assert result is not None
        return result

    def stored_result(self, app: App, thread: str) -> RunResult[Any]:
        if isinstance(app, LangGraphApp | PydanticAIApp | LoopApp):
            return app.result(thread)
        graph = app.copy(self.checkpointer)
        state = graph.get_state(thread)
        snap = self.checkpointer.get_thread(thread)
        if state is None or snap is None:
            raise RuntimeError(f"thread {thread!r} vanished after the resume")
        return RunResult(thread, state, snap.version)

    def _order(self, batch: list[ToolCallInfo]) -> Groups:
        """The seeded order in which a batch's parallel calls pass from return to record (see the runtime's
        ``set_completion_order``): the same seed, hit and run give the same order in every process."""
        self._batches += 1
        if self._order_label == "clean":
            self.planner.widest = max(self.planner.widest, len(batch))
        rng = random.Random(
            f"{self.seed}:{self.nodeid}:{self.hit}:{self._drive_index}:{self._order_label}:{self._batches}"
        )
        return self.orders.pick([info.index for info in batch], self.order, rng)

    def _drive(self, app: App, input: Inputs, config: dict[str, Any], stream: bool) -> RunResult[Any]:
        if config.pop("thread_id", None) is not None:
            raise pytest.UsageError("crash_run.invoke: leave thread_id out of config; crash_run assigns thread ids")
        self.driven = True
        self._prefix = app.thread_prefix if isinstance(app, PydanticAIApp) else ""
        remove = install(Instrument(on_tool=self.log.observe, completion_order=self._order))
        unwitness = witness.install(app, self.log)  # the harness's own view from inside the tool bodies
        try:
            if self.cell is None:
                return self._clean_only(app, input, config, stream)
            return self._matrix(app, input, config, stream)
        finally:
            remove()
            unwitness()
            self._drive_index += 1

    def _clean_only(self, app: App, input: Inputs, config: dict[str, Any], stream: bool) -> RunResult[Any]:
        self.thread_id = self._new_thread("clean")
        result = self.run_graph(app, input, self.thread_id, config, stream, "clean")
        problems = clean_run_problems(result.messages, self.entries(self.thread_id))
        if problems:
            raise ReplaySafetyViolation("; ".join(problems))
        return result

    def _effects_on(self, thread: str) -> list[dict[str, Any]] | None:
        return self.effects.applied(thread_id=thread) if self.effects is not None else None

    def _learn(self, app: App, input: Inputs, config: dict[str, Any], stream: bool) -> LearnedDrive:
        assert self.cell is not None
        thread = self._new_thread("clean")
        try:
            with crashpoints.counting() as counts:
                clean = self.run_graph(app, input, thread, config, stream, "clean")
        except Exception as exc:  # no crash was injected: the cell cannot be judged
            detail = f"the clean run (no crash injected) failed: {type(exc).__name__}: {exc}"
            self._record(0, Outcome.ERROR, None, {}, 0.0, detail)
            raise ReplaySafetyViolation(f"ERROR: {detail}\n    repro: {self.results[-1].repro}") from exc
        entries = self.entries(thread)
        for tool, pairs in windows(entries).items():  # the clean run's exposure windows, per tool
            self.exposure.setdefault(tool, []).extend(pairs)
        reached = counts.get(self.cell.point, 0)
        if self.cell.point == "langgraph.late_put_writes" and self._saver is not None:  # (a later return to hold)
            reached = self._saver.late_reach(thread, entries)
        ref = reference(clean.messages, clean.final_text, entries, self._effects_on(thread))
        drive = LearnedDrive(reached, ref, clean, dict(counts))
        if self.cell.budget:
            drive.reached = min(drive.reached, 2)
        self.drives.append(drive)
        if drive.reached == 0:  # vacuous; not applicable at a point of streamed models where the model does not stream
            outcome = Outcome.NOT_APPLICABLE if self.cell.point in MODE_POINTS else Outcome.VACUOUS
            detail = f"{self.cell.point} was never reached by a clean run of this test{reach_hint(self.cell.point)}"
            self._record(0, outcome, None, {}, 0.0, detail)
            if outcome == Outcome.NOT_APPLICABLE:
                pytest.skip(f"not_applicable: {detail}")
            raise ReplaySafetyViolation(f"VACUOUS: {detail}\n    repro: {self.results[-1].repro}")
        return drive

    def _matrix(self, app: App, input: Inputs, config: dict[str, Any], stream: bool) -> RunResult[Any]:
        assert self.cell is not None
        cell = self.cell
        mode = FAULT_MODE_OBJECTS.get(cell.mode) or MODES[cell.mode]
        stream = stream or mode.name == "stream"
        first = self._drive_index >= len(self.drives)
        drive = self._learn(app, input, config, stream) if first else self.drives[self._drive_index]
        hit = cell.budget_hit(drive.reached) if cell.budget else self.hit
        if hit > drive.reached:  # this execution's hit is past this drive's last: run it clean
            self.thread_id = drive.clean.thread_id
            if first:
                return drive.clean
            self.thread_id = self._new_thread("clean")
            return self.run_graph(app, input, self.thread_id, config, stream, "clean")
        started = time.perf_counter()
        thread = self._new_thread(f"hit{hit}")
        self.thread_id = thread
        target = Hit(app, input, config, stream, cell.point, hit, thread)
        target.langgraph = (app.durability or "async") if isinstance(app, LangGraphApp) else ""
        target.framework = self.framework
        if cell.window is not None:  # a budgeted contest: the lock holder pauses at this lock window
            target.window, target.contested_window = window_arrival(cell.window, hit - 1, drive.counts), cell.window
        tools = frozenset(self.tools) if self.tools is not None else getattr(app, "judged", None)
        count = self.then is None and self.depth.depth > 1
        played = play(self, mode, target, self.then, cell.mode in FAULT_MODE_OBJECTS, count, tools)
        if played.skipped:  # the resume never reached the second crash: nothing new to judge
            return self.stored_result(app, thread)
        evidence = played.evidence
        evidence.effects = self._effects_on(thread)
        outcome, gap, detail = judge(evidence, drive.ref, self.rules, cell.point, cell.mode, cell.backend)
        self._excused = self._excused or evidence.excused  # (a read ran again: the point's gap need not show)
        self._record(hit, outcome, gap, dict(evidence.executions()), time.perf_counter() - started, detail)
        r = self.results[-1]
        r.gap_reasons = gap_reasons(self.rules, cell.point, gap or "", cell.mode, cell.backend)
        labels = call_labels(evidence.final_messages or [])
        crashed = played.crash.crashed
        schedule = timeline.Schedule(cell.point, hit, cell.mode, crashed, played.fault, played.second, played.before)
        r.timeline = timeline.build(evidence.entries, played.fault_at, labels, schedule, evidence.resume_error)
        window = (target.contested_window or target.window[0]) if target.contested else None
        r.coverage = coverage.of_cell(evidence, mode.name, window, self.framework)
        if evidence.effects is not None:
            r.effects_applied = dict(Counter(e["kind"] for e in evidence.effects))
        r.not_applied = evidence.not_applied
        if outcome in FAILING:
            raise ReplaySafetyViolation(f"hit {hit}: {outcome.upper()}: {detail}\n    repro: {r.repro}")
        return played.result if played.result is not None else drive.clean

    # -- what playing a schedule needs (see :mod:`.hitrun`) ----------------------------------------------------
    def spoil_cache(self, thread: str) -> str | None:
        """Before a resume, a backend with a cache puts it in a wrong state (``--crash-faults=cache``)."""
        stale = self.backend.stale_cache if self.backend is not None and "cache" in self.faults else None
        return stale(self.checkpointer.inner, thread, self.workdir) if stale is not None else None

    def keep_resume_counts(self, counts: dict[str, int]) -> None:
        self.planner.keep(self.hit, self.order, counts)

    def repro(self, hit: int | None = None) -> str:
        """The command that runs this execution's schedule again (at *hit*, default this execution's)."""
        hit = self.hit if hit is None else hit
        if not hit:
            return self.repro_base
        order = self.orders.flag(self.order, self.planner.widest > 1)
        return f"{self.repro_base} --crash-hits={hit}{order}{self.depth.flag(self.then)}"

    def _record(
        self, hit: int, outcome: Outcome, gap: str | None, executions: dict[str, int], duration: float, detail: str
    ) -> None:
        assert self.cell is not None
        repro = self.repro(hit)
        self.results.append(CellResult(
            self.nodeid, self.cell.point, hit, self.cell.backend, self.cell.mode, outcome, gap=gap,
            executions=executions, duration_s=round(duration, 4), repro=repro, detail=detail, order=self.order,
            then=str(self.then) if self.then is not None else None,
        ))  # fmt: skip
