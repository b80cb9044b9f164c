"""The before and after of a plain agent loop (a loop over ``chat.completions``, no framework) under the crash
matrix; the official ``openai`` SDK runs against a scripted endpoint (no network).

pytest examples/plain_loop --crash-matrix                      # after: 0 violations, documented gaps only
pytest examples/plain_loop --crash-matrix --runxfail -k bare   # before: the violations, each with repro
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

pytest.importorskip("openai", reason="the openai extra is not installed: pip install 'tenxgraph[openai]'")

from examples.plain_loop.agent import bare_support_loop, make_tools, support_loop
from examples.plain_loop.conversations import Conversations
from examples.plain_loop.provider import FINAL, scripted_client
from pytest_replaysafe import CrashRun, Effects, ReplaySafetyViolation

PROMPT = {"prompt": "Please refund order A-1042 and let the customer know."}


@pytest.mark.crash_matrix(framework="loop", backends="memory,sqlite,postgres")
def test_support_loop(crash_run: CrashRun, effects: Effects, tmp_path: Path) -> None:
    """The loop with the ledger, killed and resumed at every point: a finished call is replayed, never run
    again; the email runs again under the same idempotency key (deduped); the refund, caught in flight, is in
    doubt and not run again (the model is told it failed: its effect happened once or not at all)."""
    loop = partial(support_loop, client=scripted_client, tools=make_tools(effects), ledger=crash_run.checkpointer,
                   conversations=Conversations(tmp_path / "conversations.db"))  # fmt: skip
    conversation = crash_run.invoke(loop, PROMPT)
    assert conversation.final_text == FINAL
    sent = {kind: effects.count(kind, thread_id=crash_run.thread_id) for kind in ("refund", "email")}
    in_doubt = any(r.is_error for m in conversation.messages for r in m.tool_results)
    assert sent["email"] == 1
    assert sent["refund"] == 1 if not in_doubt else sent["refund"] <= 1


@pytest.mark.xfail(
    raises=ReplaySafetyViolation,
    strict=False,
    reason="the before: a retried loop runs the calls of its stored message again (--runxfail shows them)",
)
@pytest.mark.crash_matrix(framework="loop", backends="sqlite", points="tool.in_flight")
def test_bare_support_loop(crash_run: CrashRun, effects: Effects, tmp_path: Path) -> None:
    """The same loop calling its functions itself: a crash after the refund's effect and before its result was
    stored, and the retried job refunds again."""
    schemas = [t.schema() for t in make_tools(effects)]
    loop = partial(bare_support_loop, client=scripted_client, schemas=schemas, effects=effects,
                   conversations=Conversations(tmp_path / "conversations.db"))  # fmt: skip
    conversation = crash_run.invoke(loop, PROMPT)
    assert conversation.final_text == FINAL
