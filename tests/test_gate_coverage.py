"""The gate reaches what it did not use to: record groups of 2+ (siblings that return together), replayed errors
compared, distinct calls held to distinct keys, every lock window contested, recovery and prune-then-resume as
resume paths, every documented mode x point green on a correct runtime, and a coverage section in every report."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_replaysafe.judge.evidence import Entry, call_id_of
from pytest_replaysafe.judge.provenance import provenance, shared_keys
from pytest_replaysafe.matrix import services
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel
from tenxgraph.core.graph.utils.instrument import set_completion_order
from tenxgraph.state.messages import ToolCallBlock, ToolResultBlock
from tenxgraph.storage.checkpointer import SqliteCheckpointer

ROOT = Path(__file__).resolve().parent.parent


class CountingSqlite(SqliteCheckpointer):
    """Counts the group commits (``aput_tool_results``) and single record writes."""

    groups: list[int]

    async def aput_tool_results(self, thread_id: str, records: Any) -> Any:
        self.groups.append(len(records))
        return await super().aput_tool_results(thread_id, records)

    async def aput_tool_result(self, thread_id: str, key: str, record: Any) -> bool:
        self.groups.append(1)
        return await super().aput_tool_result(thread_id, key, record)


def test_a_completion_order_group_is_one_group_commit(tmp_path: Path) -> None:
    """Calls of one group in the completion order return together and are recorded in one write; single-file
    calls are recorded one by one (the old harness could only do the latter)."""

    async def slow(x: int) -> int:
        """Slow."""
        await asyncio.sleep(0.02)
        return x

    def fast(x: int) -> int:
        """Fast."""
        return x + 100

    model = ScriptedModel([Reply(tool_calls=[("slow", {"x": 1}), ("fast", {"x": 2}), ("fast", {"x": 3})]), "ok"])
    for order, expected in (([[0, 1, 2]], [3]), ([[2], [0], [1]], [1, 1, 1]), ([[1], [0, 2]], [1, 2])):
        cp = CountingSqlite(tmp_path / f"{len(expected)}-{expected[0]}.db")
        cp.groups = []
        remove = set_completion_order(lambda batch, order=order: order)  # type: ignore[misc]
        try:
            result = (
                ReactAgent(model, tools=[slow, fast])
                .compile(checkpointer=cp)
                .invoke({"messages": [Message.text_message("go")]}, {"thread_id": "t"})
            )
        finally:
            remove()
            cp.close()
        assert [r.output for m in result.messages for r in m.tool_results] == [1, 102, 103]
        assert cp.groups == expected, (order, cp.groups)


def _entry(event: str, call: str, fp: str | None, error: bool = False, ikey: str | None = None) -> Entry:
    return Entry("t", call, event, "refund", fp=fp, error=error, ikey=ikey, call=call)


def test_a_replayed_answer_is_compared_with_its_error_flag() -> None:
    from pytest_replaysafe.judge.evidence import fingerprint

    text = "RuntimeError: card declined"
    ask = Message.assistant(tool_calls=[ToolCallBlock("c1", "refund", {})], message_id="m")
    call = call_id_of("m", 0)
    failed = [_entry("start", call, None), _entry("end", call, fingerprint(text), error=True)]
    as_success = [ask, Message.tool(ToolResultBlock("c1", text, is_error=False))]
    as_failure = [ask, Message.tool(ToolResultBlock("c1", text, is_error=True))]
    assert provenance(as_failure, failed, {}, None) == []
    problems = provenance(as_success, failed, {}, None)
    assert problems == [f"{call} was answered as a success although its body failed (error flag not replayed)"]
    flipped = [*failed, _entry("record", call, fingerprint(text), error=False)]
    assert any("flips its error flag" in p for p in provenance(as_failure, flipped, {}, None))


def test_distinct_calls_must_get_distinct_idempotency_keys() -> None:
    keys = {"m1:0": {"tenx-a"}, "m2:0": {"tenx-a"}, "m2:1": {"tenx-b"}}
    problems = shared_keys(keys, {"m1:0": "refund(order=1)", "m2:0": "email(to=ada)"})
    assert len(problems) == 1 and "refund(order=1) and email(to=ada) were given the same idempotency key" in problems[0]
    assert shared_keys({"m1:0": {"tenx-a"}, "m2:0": {"tenx-b"}}, {}) == []


def _matrix(tmp_path: Path, name: str, *args: str, target: str = "examples") -> tuple[int, dict[str, Any], str]:
    report = tmp_path / f"{name}.json"
    command = [sys.executable, "-m", "pytest", *target.split(), "-p", "no:cacheprovider", "-q", "-p", "no:randomly"]
    command += ["--crash-matrix", "--crash-seed=1", f"--crash-report={report}", *args]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads(report.read_text()), proc.stdout


def _durable_backends() -> str:
    return "sqlite,postgres" if os.environ.get(services.ENV_PG) else "sqlite"


def test_a_default_matrix_reaches_groups_windows_and_resume_paths(tmp_path: Path) -> None:
    """A default run over the parallel example: record groups of 2+ on every durable backend, a contest at every
    lock window, every resume path, every crash point; printed under the grid."""
    code, data, out = _matrix(
        tmp_path, "default", "-n", "2", f"--crash-backends={_durable_backends()}", target="examples/parallel_tools"
    )
    assert code == 0, out[-3000:]
    cov = data["coverage"]
    assert all(n >= 2 for n in cov["largest_record_group"].values()), cov
    assert set(cov["largest_record_group"]) == set(_durable_backends().split(","))
    for dimension in ("crash_points", "resume_paths", "lock_windows"):
        assert cov[dimension]["not_reached"] == [], (dimension, cov[dimension])
    assert "coverage of this matrix" in out and "lock windows     9 of 9" in out
    assert {c["order"] for c in data["cells"]} == {0, 1}  # single file, and together


def test_every_documented_mode_and_point_is_green_on_a_correct_runtime(tmp_path: Path) -> None:
    """Every mode (resume modes and SQLite's fault mode included) at every point, on one example, and the option
    combination that used to give a strict XPASS: no failing cell, exit 0."""
    modes = "inprocess,sigkill,stream,concurrent,recovery,prune,readonly"
    code, data, out = _matrix(
        tmp_path, "all", "-n", "2", "--crash-backends=sqlite", f"--crash-modes={modes}", "--crash-faults=readonly",
        target="examples/support_refund",
    )  # fmt: skip
    failing = [c for c in data["cells"] if c["outcome"] in ("violation", "resume_failed", "failed", "vacuous", "error")]
    assert code == 0 and not failing, (failing[:3], out[-2000:])
    assert {c["mode"] for c in data["cells"]} == set(modes.split(","))
    code, data, out = _matrix(
        tmp_path, "read-error", "--crash-backends=sqlite", "--crash-modes=inprocess,concurrent",
        "--crash-points=ledger.read_error",
    )  # fmt: skip
    assert code == 0, out[-3000:]
    assert any(c["mode"] == "concurrent" and c["outcome"] == "known_gap" for c in data["cells"]), data["summary"]


def test_every_storage_fault_mode_is_green_on_a_correct_runtime(tmp_path: Path) -> None:
    """The fault modes of the PostgreSQL backends, at every point, on the support agent and the outbox (whose relay
    and effects read the database beside the run, never through the harness's fault proxy): no failing cell."""
    if not (os.environ.get(services.ENV_PG) and os.environ.get(services.ENV_REDIS)):
        if services.services_required():
            pytest.fail(f"{services.ENV_PG} and {services.ENV_REDIS} are needed for the storage fault modes")
        pytest.skip(f"set {services.ENV_PG} and {services.ENV_REDIS} for the storage fault modes")
    code, data, out = _matrix(
        tmp_path, "faults", "-n", "2", "--crash-backends=postgres+redis", "--crash-modes=drop,outage,redis-down",
        "--crash-faults=drop,outage,redis-down,cache", target="examples/support_refund examples/outbox",
    )  # fmt: skip
    failing = [c for c in data["cells"] if c["outcome"] in ("violation", "resume_failed", "failed", "vacuous", "error")]
    assert code == 0 and not failing, (failing[:3], out[-2000:])
    assert {c["mode"] for c in data["cells"]} == {"drop", "outage", "redis-down"}


@pytest.mark.parametrize("fmt", ["markdown", "html"])
def test_the_coverage_section_is_in_every_report(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"r.{fmt}"
    option = "--crash-markdown" if fmt == "markdown" else "--crash-html"
    code, data, _ = _matrix(
        tmp_path, fmt, "--crash-backends=memory", "--crash-points=tool.after_record", f"{option}={path}",
        target="examples/support_refund",
    )  # fmt: skip
    assert code == 0 and "coverage" in data
    text = path.read_text()
    if fmt == "markdown":
        assert "Coverage of this matrix" in text and "- lock windows     0 of 9; not reached: run.before_node" in text
    else:
        assert '"coverage":' in text and "renderCoverage" in text
