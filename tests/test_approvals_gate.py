"""The gate on approvals: the crash matrix over examples/approved_refund proves the approval flow (every cell
protected or a documented gap, the pause and decision points and the double-resume mode reached), and catches
each approval mutant of tests/mutants.py for its own reason (``-s`` prints how many cells caught each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.mutants import APPROVAL_MUTANTS

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "approved_refund" / "test_approved_refund.py"

#: What each mutant must be caught by: a part of the detail of its violation cells.
CAUSES = {
    "decisions_not_read_back": "was asked for again after its decision",
    "approved_call_runs_again": "executed 2 times",
    "rejection_reason_approves": "ran although a person rejected it",
    "decision_not_recorded": "ran although its approval was never recorded",
}


def approval_matrix(folder: Path, mutant: str | None, backends: str) -> dict[str, Any]:
    folder.mkdir()
    (folder / "conftest.py").write_text(f"from tests.mutants import apply\n\napply({mutant!r})\n")
    (folder / "test_approved_refund.py").write_text(EXAMPLE.read_text())
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", "no:xdist", "--crash-matrix"]
    command += [f"--crash-backends={backends}", "--crash-seed=3", "--crash-report=r.json", "test_approved_refund.py"]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert (folder / "r.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return {"exit": done.returncode, **json.loads((folder / "r.json").read_text())}


@pytest.mark.xdist_group("approvals-gate")
def test_the_matrix_proves_approvals_and_catches_each_broken_one(tmp_path: Path) -> None:
    assert set(CAUSES) == set(APPROVAL_MUTANTS)
    names: list[str | None] = [None, *APPROVAL_MUTANTS]
    with ThreadPoolExecutor(max_workers=2) as pool:
        found = pool.map(lambda m: approval_matrix(tmp_path / (m or "control"), m, "sqlite"), names)
        reports = dict(zip(names, found, strict=True))
    control = reports[None]
    cells = control["cells"]
    assert control["exit"] == 0 and control["summary"]["violation"] == 0, [c["detail"] for c in cells][:3]
    reached = {(c["point"], c["mode"]) for c in cells if c["outcome"] == "protected"}
    for point in ("approval.after_pause", "approval.after_decision"):
        assert {(point, m) for m in ("inprocess", "sigkill", "stream", "double-resume")} <= reached
    assert {c["outcome"] for c in cells if c["mode"] == "double-resume"} <= {"protected", "known_gap"}
    for mutant, cause in CAUSES.items():
        caught = [c for c in reports[mutant]["cells"] if c["outcome"] == "violation" and cause in c["detail"]]
        print(f"  {mutant:28} {len(caught):4} violation cells: {cause!r}")
        assert len(caught) > 1, (mutant, sorted({c["detail"][:200] for c in reports[mutant]["cells"]})[:5])
        assert reports[mutant]["exit"] != 0
