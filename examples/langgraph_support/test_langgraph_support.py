"""The before and after of a LangGraph agent under the crash matrix (needs the langgraph extra).

pytest examples/langgraph_support --crash-matrix                # after: 0 violations, documented gaps only
pytest examples/langgraph_support --crash-matrix --runxfail -k bare   # before: the violations, each with repro
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langgraph", reason="the langgraph extra is not installed: pip install 'tenxgraph[langgraph]'")

from examples.langgraph_support.agent import FINAL, build_agent
from pytest_replaysafe import Approvals, CrashRun, Effects, ReplaySafetyViolation

REQUEST = {"messages": [("user", "refund 1042, tell the customer, open a ticket")]}


@pytest.mark.crash_matrix(framework="langgraph", backends="memory,sqlite,postgres")
def test_replay_safe_tool_node(crash_run: CrashRun, effects: Effects) -> None:
    app = build_agent(crash_run.langgraph_checkpointer, effects, ledger=crash_run.checkpointer)
    result = crash_run.invoke(app, REQUEST, {"durability": "sync"})
    assert result.final_text == FINAL
    sent = {kind: effects.count(kind, thread_id=crash_run.thread_id) for kind in ("refund", "email", "ticket")}
    assert sent == {"refund": 1, "email": 2, "ticket": 1}  # each call's key dedupes what a gap runs again


@pytest.mark.crash_matrix(framework="langgraph", backends="memory,sqlite,postgres")
def test_async_graph(crash_run: CrashRun, effects: Effects) -> None:
    """The same agent with an async node: LangGraph runs it through ``ainvoke`` / ``astream`` only, and so does
    the harness (``invoke`` would raise LangGraph's TypeError)."""
    app = build_agent(crash_run.langgraph_checkpointer, effects, ledger=crash_run.checkpointer, run_async=True)
    assert crash_run.invoke(app, REQUEST, {"durability": "sync"}).final_text == FINAL
    sent = {kind: effects.count(kind, thread_id=crash_run.thread_id) for kind in ("refund", "email", "ticket")}
    assert sent == {"refund": 1, "email": 2, "ticket": 1}


@pytest.mark.crash_matrix(framework="langgraph", backends="sqlite,postgres")
def test_approved_refund(crash_run: CrashRun, effects: Effects, approvals: Approvals) -> None:
    """The refund waits for a person (LangGraph's own ``interrupt()``, asked by ReplaySafeToolNode); the
    harness's person approves it, in every cell: once per thread, whatever the crash, and in the ``resumers``
    mode each answer is sent by three processes at once."""
    app = build_agent(crash_run.langgraph_checkpointer, effects, ledger=crash_run.checkpointer,
                      approvals={"refund_order": True})  # fmt: skip
    assert crash_run.invoke(app, REQUEST, {"durability": "sync"}).final_text == FINAL
    asked = approvals.asked(crash_run.thread_id)
    assert {(i.kind, i.tool) for i in asked} == {("approval", "refund_order")}
    sent = {kind: effects.count(kind, thread_id=crash_run.thread_id) for kind in ("refund", "email", "ticket")}
    assert sent == {"refund": 1, "email": 2, "ticket": 1}


# (the points where a rejection could be lost or a refund slip through: the tool step and its saved writes)
@pytest.mark.crash_matrix(
    framework="langgraph",
    backends="sqlite,postgres",
    points="tool.before_invoke,tool.after_return,tool.after_record,langgraph.after_put_writes",
)
def test_rejected_refund(crash_run: CrashRun, effects: Effects, approvals: Approvals) -> None:
    """A person says no: the refund never runs, in any cell, and the model is told why."""
    approvals.answer("no receipt")
    app = build_agent(crash_run.langgraph_checkpointer, effects, ledger=crash_run.checkpointer,
                      approvals={"refund_order": True})  # fmt: skip
    result = crash_run.invoke(app, REQUEST, {"durability": "sync"})
    refused = [r.output for m in result.messages for r in m.tool_results if r.is_error]
    assert refused == ["the call to 'refund_order' was rejected by a person and did not run: no receipt"]
    sent = {kind: effects.count(kind, thread_id=crash_run.thread_id) for kind in ("refund", "email", "ticket")}
    assert sent == {"refund": 0, "email": 2, "ticket": 1}


# The checkpointers whose transaction a tool can join: SQLite and PostgreSQL (docs/langgraph.md).
@pytest.mark.crash_matrix(framework="langgraph", backends="sqlite,postgres")
def test_transactional_refund(crash_run: CrashRun, effects: Effects) -> None:
    """The refund is a row of the ledger's database, written in the call's transaction: exactly once in every
    cell, with no gap (the effect is counted in that database, outside the run)."""
    cp = crash_run.checkpointer
    if cp.transactions == "async":  # PostgreSQL: a plain tool in a sync graph gets a BlockingTransaction

        def book(tx: Any, payload: dict[str, Any]) -> object:
            return tx.run(effects.aapply_in(tx.connection, "refund", payload, cp.schema))["effect_id"]
    else:

        def book(tx: Any, payload: dict[str, Any]) -> object:
            return effects.apply_in(tx, "refund", payload)["effect_id"]

    app = build_agent(crash_run.langgraph_checkpointer, effects, ledger=cp, book_refund=book)
    result = crash_run.invoke(app, REQUEST, {"durability": "sync"})
    assert result.final_text == FINAL
    sent = {kind: effects.count(kind, thread_id=crash_run.thread_id) for kind in ("refund", "email", "ticket")}
    assert sent == {"refund": 1, "email": 2, "ticket": 1}


@pytest.mark.xfail(
    raises=ReplaySafetyViolation,
    strict=False,
    reason="the before: LangGraph's bare ToolNode runs finished siblings again (--runxfail shows the violations)",
)
@pytest.mark.crash_matrix(framework="langgraph", backends="sqlite,postgres")
def test_bare_tool_node(crash_run: CrashRun, effects: Effects) -> None:
    result = crash_run.invoke(build_agent(crash_run.langgraph_checkpointer, effects), REQUEST, {"durability": "sync"})
    assert result.final_text == FINAL


@pytest.mark.xfail(
    raises=ReplaySafetyViolation,
    strict=False,
    reason="the before: k processes resuming LangGraph's bare interrupt() refund k times (--runxfail shows them)",
)
@pytest.mark.crash_matrix(
    framework="langgraph", backends="sqlite,postgres", modes="resumers", points="tool.before_invoke,langgraph.after_put"
)
def test_bare_interrupt(crash_run: CrashRun, effects: Effects, approvals: Approvals) -> None:
    """LangGraph's docs' way: the refund's body asks with ``interrupt()`` under a bare ToolNode. Every process
    that resumes the pause runs the refund (the ``resumers`` mode sends each answer from three at once)."""
    app = build_agent(crash_run.langgraph_checkpointer, effects, ask_in_tool=True, one_call_a_turn=True)
    assert crash_run.invoke(app, REQUEST, {"durability": "sync"}).final_text == FINAL
    assert effects.count("refund", thread_id=crash_run.thread_id) == 1
