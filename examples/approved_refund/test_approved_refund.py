"""`pytest --crash-matrix examples/approved_refund` kills and resumes this agent at every crash point, the pause and
the decision included, and sends every approval twice (the ``double-resume`` mode)."""

from __future__ import annotations

import pytest

from examples.approved_refund.agent import build_agent
from pytest_replaysafe import Approvals, CrashRun, Effects
from tenxgraph import Message

REQUEST = {"messages": [Message.text_message("refund orders 1042 and 1043")]}


@pytest.mark.crash_matrix
def test_an_approved_refund_runs_once(crash_run: CrashRun, effects: Effects, approvals: Approvals) -> None:
    app = build_agent(checkpointer=crash_run.checkpointer, payments=effects)
    result = crash_run.invoke(app, REQUEST)  # the harness's person approves the refund that waits
    assert result.status == "done"
    asked = approvals.asked(crash_run.thread_id)  # the supervisor was asked once, whatever the crash
    assert [(i.kind, i.args) for i in asked] == [("approval", {"order_id": "1042", "amount": 250.0})]
    refunds = sorted(e["payload"]["order"] for e in effects.applied(thread_id=crash_run.thread_id))
    assert refunds == ["1042", "1043"]  # each once, whatever the crash


@pytest.mark.crash_matrix(points=["approval.after_pause", "approval.after_decision", "tool.after_record"])
def test_a_rejected_refund_never_runs(crash_run: CrashRun, effects: Effects, approvals: Approvals) -> None:
    approvals.answer(lambda interrupt: "over the limit without a receipt")
    final = "Refunded 30.00 EUR on order 1043; the refund on 1042 was not approved."
    result = crash_run.invoke(build_agent(crash_run.checkpointer, effects, final), REQUEST)
    assert result.final_text == final
    rejected = [r for m in result.messages for r in m.tool_results if r.status == "rejected"]
    assert [r.output for r in rejected] == [
        "the call to 'refund_order' was rejected by a person and did not run: over the limit without a receipt"
    ]
    refunds = [e["payload"]["order"] for e in effects.applied(thread_id=crash_run.thread_id)]
    assert refunds == ["1043"]
