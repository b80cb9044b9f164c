"""``--crash-replay``: an earlier report's failing cells run again exactly, and nothing else runs."""

from __future__ import annotations

import json

import pytest

from tests.test_plugin import PROTECTED, SABOTAGE, write

pytest_plugins = ["pytester"]


def failing(path: object) -> set[tuple[str, str, int, int]]:
    data = json.loads(path.read_text())  # type: ignore[attr-defined]
    return {(c["test"], c["outcome"], c["hit"], c["order"]) for c in data["cells"] if c["outcome"] == "violation"}


def test_the_failing_cells_of_a_report_run_again_and_only_they(pytester: pytest.Pytester) -> None:
    write(pytester, PROTECTED.replace('"run.before_node", ', ""), conftest=SABOTAGE)
    first = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--crash-matrix", "--crash-backends=amnesiac,sqlite", "--crash-report=first.json"
    )
    first.assert_outcomes(passed=23, failed=11)  # see tests/test_plugin.py's broken ledger
    before = failing(pytester.path / "first.json")
    assert before
    lines = first.stdout.lines[
        first.stdout.lines.index(next(x for x in first.stdout.lines if x.startswith("VIOLATION"))) :
    ]
    hits = [int(x.split(" hit ")[1].split(",")[0]) for x in lines if x.startswith("VIOLATION test_refund at")]
    assert hits == sorted(hits)  # smallest failing schedule first

    again = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--crash-replay=first.json", "--crash-report=again.json"
    )
    outcomes = again.parseoutcomes()
    assert outcomes["failed"] == 11 and "passed" not in outcomes and outcomes["deselected"] >= 10  # nothing else ran
    assert failing(pytester.path / "again.json") == before
    data = json.loads((pytester.path / "again.json").read_text())
    assert data["seed"] == json.loads((pytester.path / "first.json").read_text())["seed"]
    assert {c["backend"] for c in data["cells"]} == {"amnesiac"} and len(data["cells"]) == len(before)

    (pytester.path / "junk.json").write_text("{}")
    bad = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--crash-replay=junk.json")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--crash-replay='junk.json'*not a crash-matrix JSON report*--crash-report*"])
