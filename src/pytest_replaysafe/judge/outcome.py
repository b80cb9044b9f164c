"""The outcomes a crash-matrix cell can have, and the one record of a cell every report is built from."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Outcome(StrEnum):
    """A cell's verdict. Failing outcomes fail the test; ``known_gap`` is reported as an expected failure."""

    PROTECTED = "protected"  # every recorded call ran at most once and was answered with its own result
    IN_DOUBT_HANDLED = "in_doubt_handled"  # the call in the crash window was in doubt and settled without a re-run
    EXACTLY_ONCE = "exactly_once"  # a transactional call ran again, its writes rolled back: they committed once
    KNOWN_GAP = "known_gap"  # a duplicate exactly where the gap table expects one
    VIOLATION = "violation"  # a duplicate, a wrong or lost answer, a repeated effect, a run lock not held
    RESUME_FAILED = "resume_failed"  # the resume raised: the thread could not be finished after the crash
    FAILED = "failed"  # the test's own assertions failed in this cell
    VACUOUS = "vacuous"  # the cell tested nothing: its point was never reached, or runs bypassed crash_run
    ERROR = "error"  # the harness could not run the cell (a hung child, a crash before the point)
    NOT_APPLICABLE = "not_applicable"  # e.g. a killed process with in-memory storage

    @property
    def failing(self) -> bool:
        return self in FAILING

    @property
    def symbol(self) -> str:
        return SYMBOLS[self]


FAILING = frozenset({Outcome.VIOLATION, Outcome.RESUME_FAILED, Outcome.FAILED, Outcome.VACUOUS, Outcome.ERROR})
#: Worst first: the worst outcome of a group decides how it is shown.
SEVERITY = (
    Outcome.VIOLATION,
    Outcome.RESUME_FAILED,
    Outcome.FAILED,
    Outcome.ERROR,
    Outcome.VACUOUS,
    Outcome.KNOWN_GAP,
    Outcome.IN_DOUBT_HANDLED,
    Outcome.EXACTLY_ONCE,
    Outcome.PROTECTED,
    Outcome.NOT_APPLICABLE,
)
SYMBOLS = {
    Outcome.VIOLATION: "X",
    Outcome.RESUME_FAILED: "R",
    Outcome.FAILED: "F",
    Outcome.ERROR: "E",
    Outcome.VACUOUS: "V",
    Outcome.KNOWN_GAP: "g",
    Outcome.IN_DOUBT_HANDLED: "d",
    Outcome.EXACTLY_ONCE: "=",
    Outcome.PROTECTED: "+",
    Outcome.NOT_APPLICABLE: ".",
}
LEGEND = (
    "key: + protected, = exactly once, d in doubt and handled, g known gap (expected), X violation, "
    "R resume failed, F failed, V vacuous, E error"
)


def worst(outcomes: list[Outcome]) -> Outcome:
    return min(outcomes, key=SEVERITY.index)


@dataclass
class CellResult:
    """One (test, point, hit, backend, mode): the JSON report's ``cells`` entries, the grid and the terminal lines."""

    test: str
    point: str
    hit: int
    backend: str
    mode: str
    outcome: Outcome
    gap: str | None = None
    #: Per gap name in ``gap``: why the gap table expects it here (the rule's reason).
    gap_reasons: dict[str, str] = field(default_factory=dict)
    executions: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0
    repro: str = ""
    detail: str = ""
    #: Effects the provider simulator applied on the cell's thread, per kind (when the test uses ``effects``).
    effects_applied: dict[str, int] = field(default_factory=dict)
    #: The completion order of parallel calls the cell ran under (0: the seeded default; see ``orders``).
    order: int = 0
    #: Depth 2: the second crash, during the first resume, as ``point@hit`` (None: one crash).
    then: str | None = None
    #: What happened, in order: each tool execution and ledger record, the crash, the resume, the verdict.
    timeline: list[dict[str, str]] = field(default_factory=list)
    #: What the cell exercised (see :mod:`pytest_replaysafe.judge.coverage`): record groups, results replayed, resume
    #: path, lock window.
    coverage: dict[str, Any] = field(default_factory=dict)
    #: ``in_doubt_handled``: the calls settled without a re-run whose effect never happened (nothing was done).
    not_applied: list[str] = field(default_factory=list)
    #: The test is marked ``xfail``: a failing cell is expected (a "before" that shows what the gate catches), and
    #: the closing line counts it apart (``--runxfail`` makes it count again).
    expected: bool = False

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["outcome"] = str(self.outcome)
        return data
