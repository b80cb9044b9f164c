"""The before and after of a LangGraph agent under the crash matrix (needs the langgraph extra).

pytest examples/langgraph_support --crash-matrix                # after: 0 violations, documented gaps only
pytest examples/langgraph_support --crash-matrix --runxfail -k bare   # before: the violations, each with repro
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langgraph", reason="the langgraph extra is not installed: pip install 'tenxgraph[langgraph]'")

from examples.langgraph_support.agent import FINAL, build_agent
from pytest_replaysafe import CrashRun, Effects, ReplaySafetyViolation

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
