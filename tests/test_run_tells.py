"""What a finished run tells its user (#50): a run that finishes with a call in doubt says so, on the result and in
the server's answer and stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tenxgraph import InDoubt, Message, ReactAgent, Reply, ScriptedModel, tool
from tenxgraph.core import crashpoints
from tenxgraph.storage.checkpointer import SqliteCheckpointer

pytest_plugins = ["pytester"]
GO = {"messages": [Message.text_message("refund order 1042")]}


def refund_agent(db: Path, refunds: list[str]) -> Any:
    @tool(on_in_doubt="fail")
    def refund_order(order_id: str) -> str:
        """Refund an order (money moves: never twice)."""
        refunds.append(order_id)
        return f"refunded {order_id}"

    model = ScriptedModel(
        [Reply(tool_calls=[("refund_order", {"order_id": "1042"})]), "Refunded order 1042.", "Welcome."]
    )
    return ReactAgent(model, tools=[refund_order]).compile(SqliteCheckpointer(db))


def killed_after_the_refund(db: Path, refunds: list[str]) -> Any:
    """The refund ran and returned; the process died before its record: the resume finds it in doubt."""
    app = refund_agent(db, refunds)
    with crashpoints.armed("tool.after_return"), pytest.raises(crashpoints.CrashInjected):
        app.invoke(GO, {"thread_id": "t"})
    return refund_agent(db, refunds)  # (a new process's app: nothing of the first one's memory)


def test_a_run_that_finishes_with_a_call_in_doubt_says_so(tmp_path: Path) -> None:
    refunds: list[str] = []
    app = killed_after_the_refund(tmp_path / "a.db", refunds)
    result = app.invoke(None, {"thread_id": "t"})
    assert result.status == "done" and refunds == ["1042"]  # not run again
    assert result.outcome == "in_doubt"  # not "completed": the caller must look
    (doubt,) = result.in_doubt
    assert (
        isinstance(doubt, InDoubt)
        and doubt.tool == "refund_order"
        and doubt.key == f"{result.messages[1].message_id}:call_1"
    )
    assert "outcome is unknown" in doubt.told
    later = app.invoke({"messages": [Message.text_message("thanks")]}, {"thread_id": "t"})
    assert later.in_doubt == [] and later.outcome == "completed"  # a later turn is judged on its own


def test_the_servers_answer_and_stream_carry_it(tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from tenxgraph.server import create_app

    refunds: list[str] = []
    app = killed_after_the_refund(tmp_path / "a.db", refunds)
    with TestClient(create_app(app, recovery=False), base_url="http://127.0.0.1") as client:
        answer = client.post("/threads/t/runs/stream", json={})
    events = [line for line in answer.text.splitlines() if line.startswith("data: ")]
    done = json.loads(events[-1][len("data: ") :])
    assert done["outcome"] == "in_doubt" and [d["tool"] for d in done["in_doubt"]] == ["refund_order"]
    assert refunds == ["1042"]


# -- the first screen (#50 item 4) --------------------------------------------------------------------------------
def test_the_grids_notes_fit_100_columns_and_say_what_each_sign_and_column_is() -> None:
    from pytest_replaysafe.report import grid as report

    cells = [
        {"point": "run.before_node", "backend": b, "mode": m, "outcome": o, "test": "t", "hit": 1}
        for b, m, o in [("memory", "inprocess", "protected"), ("memory", "sigkill", "not_applicable"),
                        ("memory", "double-resume", "not_applicable"), ("sqlite", "double-resume", "protected")]
    ]  # fmt: skip
    lines = report.text_grid(cells)
    assert all(len(line) <= 100 for line in lines), [line for line in lines if len(line) > 100]
    text = "\n".join(lines)
    assert "key: + protected, = exactly once," in text  # not "+ protected  = exactly once" (an equation)
    assert "double-resume killed like kill; every Resume sent twice" in text
    assert "pytest counts these 2 cells as skipped" in " ".join(text.split())


def test_make_help_names_every_target() -> None:
    import subprocess

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(["make", "-s", "help"], cwd=root, capture_output=True, text=True, check=True).stdout
    targets = [line.split()[1] for line in out.splitlines() if line.startswith("make ")]
    assert targets == ["demo", "test", "gate", "gate-merge", "bench", "lint", "clean"]


def test_collect_only_says_the_items_are_the_cells(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.crash_matrix(points=["run.before_node"], backends=["sqlite"], modes=["inprocess"])
        def test_x(crash_run):
            pass
        """
    )
    result = pytester.runpytest("--crash-matrix", "--collect-only", "-q", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        ["*test_x[[]run.before_node-sqlite-inprocess[]]*", "collected only: each crash-matrix*"]
    )
    assert "no crash-matrix cells ran" not in result.stdout.str()


# -- #50 item 3: the LangGraph test a user writes first ----------------------------------------------------------------
def test_a_langgraph_app_under_a_tenxgraph_marker_is_one_clear_failure(pytester: pytest.Pytester) -> None:
    pytest.importorskip("langgraph", reason="the langgraph extra is not installed: pip install 'tenxgraph[langgraph]'")
    pytester.makepyfile(
        """
        import pytest
        from examples.langgraph_support.agent import FINAL, build_agent

        @pytest.mark.crash_matrix  # (framework="langgraph" forgotten)
        def test_agent(crash_run, effects):
            app = build_agent(crash_run.langgraph_checkpointer, effects, ledger=crash_run.checkpointer)
            request = {"messages": [("user", "refund 1042, tell the customer, open a ticket")]}
            assert crash_run.invoke(app, request, {"durability": "sync"}).final_text == FINAL
        """
    )
    result = pytester.runpytest("--crash-matrix", "--crash-backends=sqlite", "--crash-modes=inprocess", "-p",
                                "no:cacheprovider", "-rfs")  # fmt: skip
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 1 and outcomes.get("skipped", 0) >= 5, outcomes
    result.stdout.fnmatch_lines(['*mark it @pytest.mark.crash_matrix(framework="langgraph")*'])
    assert "CrashInjected" not in result.stdout.str()


def test_a_langgraph_tests_remedies_are_in_langgraphs_terms() -> None:
    from pytest_replaysafe.judge.gaps import KNOWN_GAPS, remedies_of
    from pytest_replaysafe.judge.verdict import _asked_again

    ours, theirs = remedies_of(KNOWN_GAPS, "tenxgraph"), remedies_of(KNOWN_GAPS, "langgraph")
    assert '@tool(effect="idempotent")' in ours and "@tool(" not in theirs
    assert 'ReplaySafeToolNode(tools, ledger=..., effects={name: "idempotent"})' in theirs
    assert "current_idempotency_key()" in theirs and "transactional" not in theirs
    assert "invoke with durability='sync'" in _asked_again("async")
    assert "invoke with durability='sync'" not in _asked_again("sync") and _asked_again("") == ""
