"""Every Python code block of the README and docs/ runs, twice in a row in the same folder (a reader runs an
example again; a test block's second matrix crashes at each point's first hit only: what the first run left behind
shows in any cell).

```python blocks are executed as scripts; ```python test blocks are run as a pytest file with the plugin (with
the crash matrix on), and must pass; a ```python conftest block is the conftest.py of the next test block. A
block using DATABASE_URL gets the test PostgreSQL (and REDIS_URL).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```python( test| conftest)?\n(.*?)^```", re.S | re.M)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(kind: str) -> list[pytest.param]:  # type: ignore[valid-type]
    """``script`` blocks as ``(code,)``; ``test`` blocks as ``(code, conftest)`` (the preceding conftest block)."""
    found = []
    for doc in DOCS:
        conftest = ""
        for i, match in enumerate(FENCE.finditer(doc.read_text())):
            label, code = match.group(1), match.group(2)
            if label == " conftest":
                conftest = code
            elif label == " test" and kind == "test":
                found.append(pytest.param(code, conftest, id=f"{doc.name}-{i + 1}"))
                conftest = ""
            elif label is None and kind == "script":
                found.append(pytest.param(code, id=f"{doc.name}-{i + 1}"))
    return found


def test_the_docs_have_code() -> None:
    assert len(blocks("script")) >= 5 and len(blocks("test")) >= 3


@pytest.mark.parametrize("code", blocks("script"))
def test_script_block_runs(
    code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    if "langgraph" in code:
        pytest.importorskip("langgraph", reason="the langgraph extra is not installed: pip install '.[langgraph]'")
    if "opentelemetry.sdk" in code:
        pytest.importorskip("opentelemetry.sdk", reason="the SDK is a dev dependency: pip install opentelemetry-sdk")
    if "integrations.pydantic_ai" in code:
        pytest.importorskip("pydantic_ai.durable_exec", reason="the pydantic-ai extra is not installed")
    if "integrations.mcp" in code:
        pytest.importorskip("mcp.client.session", reason="the mcp extra is not installed: pip install '.[mcp]'")
    if "integrations.openai_agents" in code:
        pytest.importorskip("agents", reason="the openai-agents extra is not installed: pip install '.[openai-agents]'")
    if "DATABASE_URL" in code:
        monkeypatch.setenv("DATABASE_URL", request.getfixturevalue("pg_dsn"))
        monkeypatch.setenv("REDIS_URL", request.getfixturevalue("redis_url"))
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        exec(compile(code, "<doc block>", "exec"), {"__name__": "__doc_block__"})


@pytest.mark.parametrize(("code", "conftest"), blocks("test"))
def test_test_block_passes(code: str, conftest: str, pytester: pytest.Pytester) -> None:
    if "langgraph" in code:
        pytest.importorskip("langgraph", reason="the langgraph extra is not installed: pip install '.[langgraph]'")
    pytester.makepyfile(test_doc_block=code)
    args = ["-p", "no:cacheprovider", "--crash-matrix", "-q"]
    if conftest:  # hooks only count in a conftest: the docs show it as a file of its own
        pytester.makeconftest(conftest)
    elif "crash_matrix" in code:
        args.append("--crash-backends=memory,sqlite")
    for again in ([], ["--crash-hits=1"]):  # (the second run, in the folder the first left: its first hits do)
        result = pytester.runpytest_subprocess(*args, *again)
        outcomes = result.parseoutcomes()
        assert result.ret == 0, result.stdout.str()
        assert outcomes.get("passed", 0) >= 1 and not outcomes.get("failed")


def test_a_stale_depth2_figure_in_the_docs_fails_the_check(tmp_path: Path) -> None:
    """The figure docs/crash-matrix.md prints for its depth-2 command is checked by CI against that command's
    report (`tests/doc_figures.py`): the docs' own numbers pass, a changed count fails naming both."""
    from tests.doc_figures import DEPTH2, DOC, check_depth2

    shown = DEPTH2.search(" ".join(DOC.read_text().split()))
    assert shown is not None
    figures = {k: int(v) for k, v in shown.groupdict().items()}
    report = tmp_path / "d2.json"

    def with_schedules(**changed: int) -> list[str]:
        got = {"items": figures["items"], "candidates": figures["candidates"], "enumerated": figures["enumerated"]}
        got |= {"sampled": figures["sampled"], "shrunk": 0, "budget": 8, **changed}
        report.write_text(json.dumps({"schedules": got}))
        return check_depth2(report)

    assert with_schedules() == []
    assert with_schedules(candidates=figures["candidates"] + 6) == []  # the threads' race: within 1%
    stale = with_schedules(enumerated=figures["enumerated"] + 1)
    assert stale == [
        f"ran: the docs say {figures['ran']}, the command gives {figures['ran'] + 1}",
        f"enumerated: the docs say {figures['enumerated']}, the command gives {figures['enumerated'] + 1}",
    ]
    assert with_schedules(candidates=figures["candidates"] * 2)[0].startswith("candidates: the docs say")


def test_the_approvals_table_is_checked_against_a_report(tmp_path: Path) -> None:
    """docs/approvals.md's table is checked by CI against the report of the command it gives: the docs' numbers
    pass for cells that add up to them; one more known gap, or a failing cell, fails naming the row."""
    from tests.doc_figures import AP_ROW, APPROVALS_DOC, check_approvals

    rows = {m["what"]: m for m in AP_ROW.finditer(APPROVALS_DOC.read_text())}
    gaps, resent_gaps = int(rows["every cell"]["gap"]), int(rows["`double-resume` (every point)"]["gap"])
    test = "examples/approved_refund/test_approved_refund.py::test_an_approved_refund_runs_once"
    cells = [{"test": "examples/other.py::t", "point": "tool.after_record", "mode": "sigkill", "outcome": "violation"}]
    for point, mode, outcome, n in [
        ("approval.after_pause", "inprocess", "protected", int(rows["`approval.after_pause`"]["protected"])),
        ("approval.after_decision", "inprocess", "protected", int(rows["`approval.after_decision`"]["protected"])),
        ("tool.after_return", "double-resume", "known_gap", resent_gaps),
        ("run.before_node", "double-resume", "protected", int(rows["`double-resume` (every point)"]["protected"])),
        ("tool.after_return", "sigkill", "known_gap", gaps - resent_gaps),
        ("run.before_node", "memory-sigkill", "not_applicable", 3),
    ]:
        cells += [{"test": test, "point": point, "mode": mode, "outcome": outcome}] * n
    protected = int(rows["every cell"]["protected"]) - sum(1 for c in cells[1:] if c["outcome"] == "protected")
    cells += [{"test": test, "point": "tool.after_record", "mode": "inprocess", "outcome": "protected"}] * protected
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"cells": cells}))
    assert check_approvals(report) == []
    report.write_text(json.dumps({"cells": [*cells, {**cells[-1], "outcome": "violation"}]}))
    problems = check_approvals(report)
    assert problems[0].startswith("every cell: the docs say") and problems[-1] == "every cell: 1 failing cells"
