"""The gate on streaming: the crash matrix's stream mode passes our runtime (model tokens streamed, a crash
mid-stream at ``model.mid_stream`` resumed), and fails each streaming mutant of tests/mutants.py for its own
reason: a UI told that a replayed refund ran again, or that a refund just made was replayed."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import ROOT, assert_each_caught, mutant_reports
from tests.mutants import STREAM_MUTANTS

EXAMPLE = ROOT / "examples" / "support_refund" / "test_support_refund.py"
CAUSES = {
    "stream_replayed_as_fresh": "stored it as replayed=True, and it was streamed as replayed=False",
    "stream_recorded_as_replayed": "stored it as replayed=False, and it was streamed as replayed=True",
}
#: Caught over an agent one of whose tools fails (FAILING_TOOL).
ERROR_CAUSES = {"stream_error_as_success": "was streamed with error flags [False], stored with [True]"}
FAILING_TOOL = """
import pytest
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel, tool


@tool(effect="external", on_in_doubt="fail")
def refund(order_id: str, idempotency_key: str = "") -> str:
    "Refund an order."
    raise RuntimeError(f"order {order_id} is archived")


@tool(effect="read")
def lookup(order_id: str) -> str:
    "Look an order up."
    return f"order {order_id}: archived"


@pytest.mark.crash_matrix(backends=["sqlite"], modes=["stream"])
def test_a_refund_that_fails(crash_run):
    model = ScriptedModel([Reply(tool_calls=[("lookup", {"order_id": "7"}), ("refund", {"order_id": "7"})]), "done"])
    app = ReactAgent(model, tools=[lookup, refund]).compile(checkpointer=crash_run.checkpointer)
    assert crash_run.invoke(app, {"messages": [Message.text_message("refund 7")]}).final_text == "done"
"""
FAILING = ("violation", "failed", "error", "resume_failed")


def test_the_stream_mode_passes_our_runtime_and_catches_each_broken_stream(tmp_path: Path) -> None:
    assert set(CAUSES) | set(ERROR_CAUSES) == set(STREAM_MUTANTS)
    options = ["--crash-backends=sqlite", "--crash-modes=stream", "--crash-seed=5", "--crash-hits=1"]
    reports = mutant_reports(tmp_path, [None, *CAUSES], EXAMPLE, lambda _: options)
    control = reports[None]
    failing = [c for c in control["cells"] if c["outcome"] in FAILING]
    assert control["exit"] == 0 and not failing, [c["detail"][:200] for c in failing]
    mid_stream = [c for c in control["cells"] if c["point"] == "model.mid_stream"]
    assert mid_stream and all(c["outcome"] == "protected" for c in mid_stream)  # a crash mid-stream, resumed
    assert_each_caught(reports, CAUSES, outcomes=FAILING)


def test_a_failed_call_streamed_as_a_success_is_caught(tmp_path: Path) -> None:
    test_file = tmp_path / "test_failing_tool.py"
    test_file.write_text(FAILING_TOOL)
    reports = mutant_reports(tmp_path, [None, *ERROR_CAUSES], test_file, lambda _: ["--crash-seed=5", "--crash-hits=1"])
    control = reports[None]
    failing = [c for c in control["cells"] if c["outcome"] in FAILING]
    assert control["exit"] == 0 and control["cells"] and not failing, [c["detail"][:200] for c in failing]
    assert_each_caught(reports, ERROR_CAUSES, outcomes=FAILING)
