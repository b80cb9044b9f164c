from __future__ import annotations

import pytest

from examples.email_followup.agent import build_email_agent
from examples.payments import LocalProvider
from pytest_replaysafe import CrashRun, Effects
from tenxgraph import Message

TURNS = [
    {"messages": [Message.text_message("email Ada about her refund")]},
    {"messages": [Message.text_message("follow up with Ada")]},
]


@pytest.mark.crash_matrix
def test_followup_is_a_new_call_not_a_replay(crash_run: CrashRun, effects: Effects) -> None:
    result = crash_run.conversation(build_email_agent(crash_run.checkpointer, effects), TURNS)
    assert result.final_text == "Sent the follow-up."
    bodies = [e["payload"]["body"] for e in effects.applied("email", thread_id=crash_run.thread_id)]
    assert bodies == ["Your refund is on its way.", "Did the refund arrive?"]


def test_same_call_id_on_two_turns_gives_two_ledger_keys() -> None:
    mail = LocalProvider()
    app = build_email_agent(provider=mail)
    for turn in TURNS:
        result = app.invoke(turn, {"thread_id": "ada"})
    calls = [m for m in result.messages if m.tool_calls]
    assert [m.tool_calls[0].id for m in calls] == ["call_1", "call_1"]
    keys = set(app.checkpointer.list_tool_results("ada"))
    assert keys == {f"{m.message_id}:call_1" for m in calls} and len(keys) == 2
    assert len(mail.effects) == 2  # keyed by call_1 alone, the follow-up would have been "replayed" and never sent
