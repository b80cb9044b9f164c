from __future__ import annotations

import pytest

from examples.parallel_tools.agent import build_parallel_agent
from pytest_replaysafe import CrashRun, Effects
from tenxgraph import Message
from tenxgraph.core import crashpoints
from tenxgraph.core.graph.utils.instrument import add_tool_observer
from tenxgraph.storage.checkpointer import InMemoryCheckpointer

REQUEST = {"messages": [Message.text_message("refund 1042, tell the customer, open a ticket")]}


@pytest.mark.crash_matrix
def test_parallel_tools_are_replay_safe(crash_run: CrashRun, effects: Effects) -> None:
    result = crash_run.invoke(build_parallel_agent(crash_run.checkpointer, effects), REQUEST)
    assert result.final_text == "Refunded, emailed, and opened a ticket."
    for kind in ("refund", "email", "ticket"):
        assert effects.count(kind, thread_id=crash_run.thread_id) == 1


def test_finished_siblings_are_skipped_on_replay(effects: Effects) -> None:
    cp = InMemoryCheckpointer()
    runs: list[str] = []
    remove = add_tool_observer(lambda event: runs.append(event.call.tool) if event.kind == "start" else None)
    try:
        # refund and ticket are recorded, then the process "dies" while the slow email is still running
        with crashpoints.armed("tool.after_record", hit=2), pytest.raises(crashpoints.CrashInjected):
            build_parallel_agent(cp, effects, email_delay=30).invoke(REQUEST, {"thread_id": "t"})
        recorded = len(cp.list_tool_results("t"))
        ran_before = list(runs)
        build_parallel_agent(cp, effects).invoke(None, {"thread_id": "t"})
    finally:
        remove()
    assert recorded == 2 and len(ran_before) == 3
    rerun = runs[len(ran_before) :]
    assert rerun == ["send_email"]  # only the unrecorded sibling ran again
    assert sorted(e["kind"] for e in effects.applied()) == ["email", "refund", "ticket"]
