"""`pytest --crash-matrix examples/support_refund` kills and resumes this agent at every crash point."""

from __future__ import annotations

import pytest

from examples.support_refund.agent import build_support_agent
from pytest_replaysafe import CrashRun, Effects
from tenxgraph import Message

REQUEST = {"messages": [Message.text_message("refund order 1042")]}


@pytest.mark.crash_matrix
def test_refund_is_replay_safe(crash_run: CrashRun, effects: Effects) -> None:
    app = build_support_agent(checkpointer=crash_run.checkpointer, payments=effects)
    result = crash_run.invoke(app, REQUEST)
    assert result.final_text == "Refunded 20.00 EUR on order 1042."
    # Whatever the crash, even in the documented gaps where refund_order's body ran twice, the idempotency key
    # it passes makes the payment provider move money once per thread.
    assert effects.count("refund", thread_id=crash_run.thread_id) == 1


@pytest.mark.crash_matrix(points=["run.before_node", "tool.after_record", "node.after_complete"])
def test_a_failed_lookup_is_replayed_as_the_failure_it_was(crash_run: CrashRun, effects: Effects) -> None:
    """The model mistypes the order number first: that lookup fails. After a crash its recorded failure is
    replayed, and the verdict checks it is answered as the failure its body returned, error flag included."""
    app = build_support_agent(checkpointer=crash_run.checkpointer, payments=effects, mistyped="1024")
    result = crash_run.invoke(app, REQUEST)
    failed = [r for m in result.messages for r in m.tool_results if r.is_error]
    assert [r.output for r in failed] == ["LookupError: no order 1024"]
    assert result.final_text == "Refunded 20.00 EUR on order 1042."
    assert effects.count("refund", thread_id=crash_run.thread_id) == 1
