"""The before and after of a Pydantic AI agent under the crash matrix (needs the pydantic-ai extra).

pytest examples/pydantic_ai_support --crash-matrix                      # after: 0 violations, documented gaps only
pytest examples/pydantic_ai_support --crash-matrix --runxfail -k bare   # before: the violations, each with repro
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip(
    "pydantic_ai.durable_exec", reason="the pydantic-ai extra is not installed: pip install 'tenxgraph[pydantic-ai]'"
)

from examples.pydantic_ai_support.agent import FINAL, build_agent
from pytest_replaysafe import Approvals, CrashRun, Effects, ReplaySafetyViolation

PROMPT = {"user_prompt": "Please refund order A-1042."}
KINDS = ("refund", "email", "receipt")


@pytest.mark.crash_matrix(framework="pydantic_ai", backends="memory,sqlite,postgres")
def test_durable_agent(crash_run: CrashRun, effects: Effects) -> None:
    """The agent with LedgerDurability, killed and resumed at every point: its model turns are not asked again,
    a finished call never runs again, and each call's idempotency key dedupes what a crash cut short. The refund
    is declared external: a crash that caught it in flight leaves it in doubt, and it is not run again (the model
    is told it failed; its effect happened once or not at all)."""
    agent = build_agent(effects, ledger=crash_run.checkpointer)
    result = crash_run.invoke(agent, PROMPT)
    assert result.final_text == FINAL
    sent = {kind: effects.count(kind, thread_id=crash_run.thread_id) for kind in KINDS}
    refund = next(r for m in result.messages for r in m.tool_results if r.call_id == refund_call(result))
    assert sent == {"refund": sent["refund"], "email": 1, "receipt": 1}
    assert sent["refund"] == 1 if not refund.is_error else sent["refund"] <= 1


@pytest.mark.crash_matrix(framework="pydantic_ai", backends="memory,sqlite,postgres")
def test_approved_refund(crash_run: CrashRun, effects: Effects, approvals: Approvals) -> None:
    """The refund waits for a person (``requires_approval=True``): the harness plays the person, who approves it,
    through ``resume_once``. Killed and resumed at every point, the pause's too (the run came back paused; the
    answer is recorded, the run that takes it has not begun), and with k processes resuming and answering at once
    (``resumers``): the refund runs only after its approval was recorded, and each effect happens once."""
    agent = build_agent(effects, ledger=crash_run.checkpointer, approval=True)
    result = crash_run.invoke(agent, PROMPT)
    assert result.final_text == FINAL
    assert {interrupt.tool for interrupt in approvals.asked(crash_run.thread_id)} == {"refund"}
    sent = {kind: effects.count(kind, thread_id=crash_run.thread_id) for kind in KINDS}
    refund = next(r for m in result.messages for r in m.tool_results if r.call_id == refund_call(result))
    assert sent == {"refund": sent["refund"], "email": 1, "receipt": 1}
    assert sent["refund"] == 1 if not refund.is_error else sent["refund"] <= 1


# The checkpointers whose transaction a tool can join: SQLite and PostgreSQL (docs/pydantic-ai.md).
@pytest.mark.crash_matrix(framework="pydantic_ai", backends="sqlite,postgres")
def test_transactional_refund(crash_run: CrashRun, effects: Effects) -> None:
    """The refund is a row of the ledger's database, written in the call's transaction (``current_transaction()``
    in the tool's body): exactly once in every cell, with no gap and no in-doubt answer (the effect is counted in
    that database, outside the run)."""
    cp = crash_run.checkpointer
    if cp.transactions == "async":  # PostgreSQL: a plain tool gets a BlockingTransaction

        def book(tx: Any, payload: dict[str, Any]) -> object:
            return tx.run(effects.aapply_in(tx.connection, "refund", payload, cp.schema))["effect_id"]
    else:

        def book(tx: Any, payload: dict[str, Any]) -> object:
            return effects.apply_in(tx, "refund", payload)["effect_id"]

    result = crash_run.invoke(build_agent(effects, ledger=cp, book_refund=book), PROMPT)
    assert result.final_text == FINAL
    sent = {kind: effects.count(kind, thread_id=crash_run.thread_id) for kind in KINDS}
    assert sent == {"refund": 1, "email": 1, "receipt": 1}


def refund_call(result: Any) -> str | None:
    """The id of the refund's call in the run's conversation."""
    return next(c.id for m in result.messages for c in m.tool_calls if c.name == "refund")


@pytest.mark.xfail(
    raises=ReplaySafetyViolation,
    strict=False,
    reason="the before: a bare agent re-run from its saved history runs finished calls again (--runxfail shows them)",
)
# (no ledger: tool.after_record is never reached; the history the user saves is a file, the same on any backend)
@pytest.mark.crash_matrix(
    framework="pydantic_ai",
    backends="sqlite",
    points="pydantic_ai.after_model_response,pydantic_ai.after_model_record,tool.before_invoke,tool.in_flight,"
    "tool.after_return",
)
def test_bare_agent(crash_run: CrashRun, effects: Effects) -> None:
    """Pydantic AI alone: its user saves the run's messages after every step and, after a crash, runs the agent
    again on them. The response's calls all run again, finished ones included."""
    result = crash_run.invoke(build_agent(effects), PROMPT)
    assert result.final_text == FINAL


@pytest.mark.xfail(
    raises=ReplaySafetyViolation,
    strict=False,
    reason="the before: a bare agent's approval is a plain value, taken again by the run that resumes the pause",
)
@pytest.mark.crash_matrix(
    framework="pydantic_ai",
    backends="sqlite",
    points="tool.before_invoke,tool.in_flight,tool.after_return,approval.after_pause",
)
def test_bare_approved_refund(crash_run: CrashRun, effects: Effects, approvals: Approvals) -> None:
    """Pydantic AI alone (pydantic/pydantic-ai#5536): the person's approval is passed to a new run as
    ``deferred_tool_results``; a crash while that run refunds leaves the saved history paused, and the run that
    resumes it is answered again, and refunds again."""
    result = crash_run.invoke(build_agent(effects, approval=True), PROMPT)
    assert result.final_text == FINAL
