"""`python -m pytest_replaysafe.report.compare`: two reports of one seed, cell by cell."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_replaysafe.report.compare import main


def cell(point: str, outcome: str, gap: str | None = None, window: str | None = None) -> dict[str, Any]:
    item = f"t.py::test_refund[{point}-postgres-concurrent" + (f"@{window}]" if window else "]")
    return {
        "test": item, "point": point, "backend": "postgres", "mode": "concurrent", "hit": 1, "order": 0,
        "then": None, "outcome": outcome, "gap": gap, "detail": "refund_order executed 2 times",
        "coverage": {"window": window} if window else {},
    }  # fmt: skip


def write(path: Path, cells: list[dict[str, Any]]) -> str:
    path.write_text(json.dumps({"seed": 1, "cells": cells}))
    return str(path)


def test_a_cell_that_held_and_now_fails_is_a_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = write(
        tmp_path / "a.json", [cell("approval.after_pause", "protected"), cell("tool.in_flight", "known_gap")]
    )
    after = write(tmp_path / "b.json", [cell("approval.after_pause", "violation"), cell("tool.in_flight", "known_gap")])
    assert main([before, after]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION t.py::test_refund[approval.after_pause-postgres-concurrent] hit 1 order 0" in out
    assert "protected -> violation: refund_order executed 2 times" in out and "1 changed" in out


def test_a_gap_renamed_or_a_fixed_cell_is_printed_not_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = [cell("tool.in_flight", "known_gap", "in_flight"), cell("run.before_node", "violation", window="release")]
    after = [
        cell("tool.in_flight", "known_gap", "after_return"),
        cell("run.before_node", "protected", window="release"),
    ]
    assert main([write(tmp_path / "a.json", before), write(tmp_path / "b.json", after)]) == 0
    out = capsys.readouterr().out
    assert "(gap in_flight -> after_return)" in out and "[run.before_node-postgres-concurrent@release]" in out
    assert "REGRESSION" not in out


def test_a_cell_missing_after_is_a_regression_and_a_bad_file_is_named(tmp_path: Path) -> None:
    before = write(tmp_path / "a.json", [cell("tool.after_record", "protected")])
    assert main([before, write(tmp_path / "b.json", [])]) == 1
    (tmp_path / "c.json").write_text("{}")
    with pytest.raises(SystemExit, match=r"c\.json is not a crash-matrix report"):
        main([before, str(tmp_path / "c.json")])


def test_a_call_settled_in_doubt_that_now_runs_twice_is_a_regression(tmp_path: Path) -> None:
    before = write(tmp_path / "a.json", [cell("tool.in_flight", "in_doubt_handled")])
    assert main([before, write(tmp_path / "b.json", [cell("tool.in_flight", "violation")])]) == 1
