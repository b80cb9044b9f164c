"""The before and after of an OpenAI Agents SDK agent under the crash matrix (needs the openai-agents extra).

pytest examples/openai_agents_support --crash-matrix                      # after: 0 violations, documented gaps
pytest examples/openai_agents_support --crash-matrix --runxfail -k bare   # before: the violations, each with repro
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

pytest.importorskip("agents", reason="the openai-agents extra is not installed: pip install '.[openai-agents]'")

from examples.openai_agents_support.agent import (
    FINAL,
    build_agent,
    run_approved,
    run_bare,
    run_bare_approved,
    run_support,
    run_support_streamed,
)
from pytest_replaysafe import Approvals, CrashRun, Effects, ReplaySafetyViolation

PROMPT = {"prompt": "Please refund order A-1042 and let the customer know."}


@pytest.mark.crash_matrix(
    framework="openai_agents", backends="memory,sqlite,postgres", modes="inprocess,sigkill,resumers"
)
def test_replay_safe_agent(crash_run: CrashRun, effects: Effects) -> None:
    """The agent made replay-safe per run, killed and resumed at every point (and by k processes at once,
    taken in turn by ``run_replay_safe``): its model turns are not asked again, a finished call is replayed,
    never run again; the email runs again under the same idempotency key (deduplicated); the refund, caught in
    flight, is in doubt and not run again (the model is told it failed)."""
    run = partial(run_support, agent=build_agent(effects), ledger=crash_run.checkpointer)
    check(crash_run, effects, run)


@pytest.mark.crash_matrix(framework="openai_agents", backends="sqlite,postgres", modes="inprocess,sigkill,resumers")
def test_replay_safe_agent_streamed(crash_run: CrashRun, effects: Effects) -> None:
    """The same run streamed (``Runner.run_streamed`` under ``stream_replay_safe``), its events read as a UI
    reads them: each streamed model turn is journaled before its calls run, and a resume streams it from there."""
    run = partial(run_support_streamed, agent=build_agent(effects), ledger=crash_run.checkpointer)
    check(crash_run, effects, run)


def check(crash_run: CrashRun, effects: Effects, run: partial[object]) -> None:
    conversation = crash_run.invoke(run, PROMPT)
    assert conversation.final_text == FINAL
    sent = {kind: effects.count(kind, thread_id=crash_run.thread_id) for kind in ("refund", "email")}
    in_doubt = any(r.is_error for m in conversation.messages for r in m.tool_results)
    assert sent["email"] == 1
    assert sent["refund"] == 1 if not in_doubt else sent["refund"] <= 1


@pytest.mark.xfail(
    raises=ReplaySafetyViolation,
    strict=False,
    reason="the before: the SDK alone runs a crashed turn's calls again (--runxfail shows them)",
)
@pytest.mark.crash_matrix(
    framework="openai_agents", backends="sqlite", points="tool.before_invoke,tool.in_flight,tool.after_return"
)
def test_bare_agent(crash_run: CrashRun, effects: Effects, tmp_path: Path) -> None:
    """The SDK alone: its session keeps the run's items, and after a crash its user runs the agent again on
    the session. The turn's calls run again, finished ones included."""
    run = partial(run_bare, agent=build_agent(effects), sessions=str(tmp_path / "sessions.db"))
    assert crash_run.invoke(run, PROMPT).final_text == FINAL


@pytest.mark.crash_matrix(
    framework="openai_agents", backends="sqlite,postgres", modes="inprocess,sigkill,resumers,double-resume"
)
def test_approved_refund(crash_run: CrashRun, effects: Effects, approvals: Approvals) -> None:
    """The refund waits for a person (``needs_approval``); the harness plays the person, answering from the
    run's ``RunState``, and the run resumes from the answered state: killed at the pause, after the answer is
    recorded, and in the approved refund, the refund happens at most once and only after its approval; an answer
    sent twice changes nothing, and a different one sent after it is refused (``double-resume``)."""
    run = partial(run_approved, agent=build_agent(effects, approval=True), ledger=crash_run.checkpointer)
    check(crash_run, effects, run)
    assert [i.tool for i in approvals.asked(crash_run.thread_id)][-1:] == ["refund_order"]


@pytest.mark.xfail(
    raises=ReplaySafetyViolation,
    strict=False,
    reason="the before: the SDK alone takes every answer it is sent (--runxfail shows them)",
)
@pytest.mark.crash_matrix(
    framework="openai_agents",
    backends="sqlite",
    points="tool.before_invoke,tool.in_flight,tool.after_return,approval.after_pause",
    modes="inprocess,sigkill,resumers",
)
def test_bare_approved_refund(crash_run: CrashRun, effects: Effects, approvals: Approvals, tmp_path: Path) -> None:
    """The SDK alone, the refund waiting for a person: its answered state sent again (a retried request) or by k
    processes at once refunds again; killed at the pause, the retried job goes on from its session without the
    refund, and the model says it refunded."""
    run = partial(run_bare_approved, agent=build_agent(effects, approval=True), sessions=str(tmp_path / "s.db"))
    assert crash_run.invoke(run, PROMPT).final_text == FINAL
