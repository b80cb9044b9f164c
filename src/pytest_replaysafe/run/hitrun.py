"""One hit's schedule, played: the crash (or storage fault) at the cell's point, what the backend does to its
cache before the resume, the second crash of a depth-2 schedule during the first resume, and the last resume;
the evidence it leaves for :func:`pytest_replaysafe.judge.verdict.judge`. The harness (:mod:`.harness`) plans the
schedules and records the verdicts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pytest_replaysafe.judge.evidence import Entry, unfinished, unfinished_since
from pytest_replaysafe.judge.verdict import HitEvidence
from pytest_replaysafe.report import timeline
from pytest_replaysafe.run.modes import Crash, Hit, Mode, Runner
from pytest_replaysafe.run.procs import HarnessError

if TYPE_CHECKING:
    from pytest_replaysafe.matrix.schedules import SecondCrash
    from tenxgraph.core.graph.compiled import RunResult


class Player(Runner, Protocol):
    """What playing a schedule needs from the harness besides a mode's :class:`~.modes.Runner`."""

    def entries(self, thread: str) -> list[Entry]: ...

    def spoil_cache(self, thread: str) -> str | None: ...

    def keep_resume_counts(self, counts: dict[str, int]) -> None: ...


@dataclass
class PlayedHit:
    crash: Crash
    evidence: HitEvidence
    before: int  # log entries written before the first resume
    fault: str | None = None  # what a fault, and the backend's cache fault, did (for the timeline)
    second: tuple[int, str] | None = None  # depth 2: where in the log the second crash fell, and what it was
    result: RunResult[Any] | None = None
    skipped: bool = False  # depth 2: the first resume never reached the second crash (nothing new to judge)

    @property
    def fault_at(self) -> int:
        """How many log entries were written before the crash or fault (a fault the run outlived, by time)."""
        if self.crash.at is None:
            return self.before
        return sum(1 for e in self.evidence.entries[: self.before] if e.t is not None and e.t <= self.crash.at)


def play(
    run: Player,
    mode: Mode,
    hit: Hit,
    then: SecondCrash | None,
    faulted: bool,
    count: bool,
    tools: frozenset[str] | None,
) -> PlayedHit:
    """*faulted*: a storage fault, no crash (nothing was left unfinished, no crash gap applies); *count*: keep how
    often the last resume reached each point (the candidates of depth-2 schedules)."""
    crash = mode.crash(run, hit)
    before = run.entries(hit.thread) if crash.crashed else []
    window, left = (None, {}) if faulted else (crash.window, unfinished(before))
    evidence = HitEvidence(crash.crashed, window, before, left, error=crash.error, tools=tools, langgraph=hit.langgraph,
                           framework=hit.framework)  # fmt: skip
    played = PlayedHit(crash, evidence, len(before), crash.note, result=crash.result)
    if crash.result is not None:  # the run outlived its fault: nothing to resume
        evidence.final_messages, evidence.final_text = crash.result.messages, crash.result.final_text
    elif crash.crashed and not crash.error:
        spoiled = run.spoil_cache(hit.thread)
        played.fault = "; ".join(filter(None, [played.fault, spoiled])) or None
        if then is not None:  # depth 2: the first resume crashes too
            again = Hit(hit.app, hit.resume_input, hit.resume_config, hit.stream, then.point, then.hit, hit.thread)
            again.langgraph, again.framework = hit.langgraph, hit.framework
            crash2 = mode.crash(run, again)
            if not crash2.crashed and not crash2.error:
                played.skipped = True
                return played
            mid = run.entries(hit.thread)
            evidence.error = evidence.error or crash2.error
            evidence.later.append((then.point, crash2.window, unfinished_since(mid, len(before))))
            played.second = (len(mid), timeline.crash_text(then.point, then.hit, mode.name) + " of the resume")
        if not evidence.error:
            played.result = _resume(run, mode, hit, evidence, run.keep_resume_counts if count else None)
        evidence.contest, evidence.stopped = hit.contest, hit.stopped
    evidence.entries = run.entries(hit.thread)
    return played


def _resume(
    run: Player, mode: Mode, hit: Hit, evidence: HitEvidence, keep: Callable[[dict[str, int]], None] | None
) -> RunResult[Any] | None:
    from tenxgraph.core import crashpoints

    try:
        with crashpoints.counting() as counts:
            result: RunResult[Any] = mode.resume(run, hit)
    except HarnessError as exc:  # the harness failed (a hung child): no verdict on the runtime
        evidence.error = str(exc)
        return None
    except Exception as exc:
        evidence.resume_error = f"{type(exc).__name__}: {exc}"
        return None
    evidence.final_messages, evidence.final_text = result.messages, result.final_text
    if keep is not None:
        keep(counts)
    return result
