"""The gate on approvals: the crash matrix over examples/approved_refund proves the approval flow (every cell
protected or a documented gap, the pause and decision points and the double-resume mode reached), and catches
each approval mutant of tests/mutants.py for its own reason (``-s`` prints how many cells caught each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import ROOT, assert_each_caught, mutant_reports
from tests.mutants import APPROVAL_MUTANTS

EXAMPLE = ROOT / "examples" / "approved_refund" / "test_approved_refund.py"

MODES = "inprocess,double-resume"
#: What each mutant must be caught by: a part of the detail of its violation cells.
CAUSES = {
    "decisions_not_read_back": "was asked for again after its decision",
    "approved_call_runs_again": "executed 2 times",
    "rejection_reason_approves": "ran although a person rejected it",
    "decision_not_recorded": "ran although its approval was never recorded",
    "second_decision_wins": "a second different one must be refused",
    "batch_runs_while_waiting": "of its batch waited for approval",
}
#: Mutants only a mode beyond in-process shows (a different decision is sent in ``double-resume`` cells).
MUTANT_MODES = {"second_decision_wins": "double-resume"}


@pytest.mark.xdist_group("approvals-gate")
def test_the_matrix_proves_approvals_and_catches_each_broken_one(tmp_path: Path) -> None:
    assert set(CAUSES) == set(APPROVAL_MUTANTS)
    # (make demo runs the example's whole matrix on every backend: here the control in-process and with every
    # Resume sent twice, each mutant in-process, where each is caught)
    modes = {m: MODES if m is None else MUTANT_MODES.get(m, "inprocess") for m in [None, *APPROVAL_MUTANTS]}
    options = {m: ["--crash-backends=sqlite", "--crash-seed=3", f"--crash-modes={mode}"] for m, mode in modes.items()}
    reports = mutant_reports(tmp_path, list(modes), EXAMPLE, options.__getitem__)
    control = reports[None]
    cells = control["cells"]
    assert control["exit"] == 0 and control["summary"]["violation"] == 0, [c["detail"] for c in cells][:3]
    reached = {(c["point"], c["mode"]) for c in cells if c["outcome"] == "protected"}
    for point in ("approval.after_pause", "approval.after_decision"):
        assert {(point, m) for m in MODES.split(",")} <= reached
    assert {c["outcome"] for c in cells if c["mode"] == "double-resume"} <= {"protected", "known_gap"}
    assert_each_caught(reports, CAUSES)
