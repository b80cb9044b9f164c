"""The gate on LangGraph apps, proved in both directions: the crash matrix over the LangGraph example
(examples/langgraph_support) fails a bare ``ToolNode`` (a finished sibling ran again: violations, named, with
repro lines, in-process and SIGKILL) and passes ``ReplaySafeToolNode`` (no violation, the documented gaps only);
each mutant of the wrapper (tests/langgraph_mutants.py) is caught for its own reason. The wrapper's matrix is the
command docs/langgraph.md gives for its before/after table, and the table is checked against it here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="the langgraph extra is not installed: pip install 'tenxgraph[langgraph]'")

from tests.doc_figures import check_langgraph
from tests.langgraph_mutants import LG_MUTANTS

ROOT = Path(__file__).resolve().parent.parent

TESTS = """
import pytest
from examples.langgraph_support.agent import FINAL, build_agent

REQUEST = {"messages": [("user", "refund 1042, tell the customer, open a ticket")]}


@pytest.mark.crash_matrix(framework="langgraph")
def test_replay_safe(crash_run, effects):
    app = build_agent(crash_run.langgraph_checkpointer, effects, ledger=crash_run.checkpointer)
    assert crash_run.invoke(app, REQUEST, {"durability": "sync"}).final_text == FINAL


@pytest.mark.crash_matrix(framework="langgraph")
def test_replay_safe_transactional(crash_run, effects):  # (the refund: a row written in the call's transaction)
    def book(tx, payload):
        return effects.apply_in(tx, "refund", payload)["effect_id"]

    app = build_agent(crash_run.langgraph_checkpointer, effects, ledger=crash_run.checkpointer, book_refund=book)
    assert crash_run.invoke(app, REQUEST, {"durability": "sync"}).final_text == FINAL


@pytest.mark.crash_matrix(framework="langgraph", modes="resumers")
def test_approved(crash_run, effects, approvals):  # (each answer sent by three processes at once)
    app = build_agent(crash_run.langgraph_checkpointer, effects, ledger=crash_run.checkpointer,
                      approvals={"refund_order": True})
    assert crash_run.invoke(app, REQUEST, {"durability": "sync"}).final_text == FINAL


@pytest.mark.crash_matrix(framework="langgraph")
def test_replay_safe_async_durability(crash_run, effects):
    app = build_agent(crash_run.langgraph_checkpointer, effects, ledger=crash_run.checkpointer)
    assert crash_run.invoke(app, REQUEST).final_text == FINAL  # LangGraph's default durability, "async"


def failing_agent(saver, ledger, effects):
    # one turn asks for a lookup whose tool fails (LangChain's ToolException: an error ToolMessage) and a refund
    from langchain_core.messages import AIMessage
    from langchain_core.tools import ToolException, tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import tools_condition
    from tenxgraph.integrations.langgraph import ReplaySafeToolNode, current_idempotency_key

    @tool
    def lookup(order_id: str) -> str:
        'Look an order up.'
        raise ToolException(f"order {order_id} is archived")

    lookup.handle_tool_error = True

    @tool
    def refund_order(order_id: str) -> str:
        'Refund an order.'
        return str(effects.apply("refund", {"order": order_id}, current_idempotency_key())["effect_id"])

    def model(state):
        if not any(m.type == "ai" for m in state["messages"]):
            calls = [{"name": "lookup", "args": {"order_id": "7"}, "id": "call_0", "type": "tool_call"},
                     {"name": "refund_order", "args": {"order_id": "7"}, "id": "call_1", "type": "tool_call"}]
            return {"messages": [AIMessage("", tool_calls=calls)]}
        return {"messages": [AIMessage("done")]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", model)
    graph.add_node("tools", ReplaySafeToolNode([lookup, refund_order], ledger=ledger))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


@pytest.mark.crash_matrix(framework="langgraph")
def test_replay_safe_tool_error(crash_run, effects):
    app = failing_agent(crash_run.langgraph_checkpointer, crash_run.checkpointer, effects)
    result = crash_run.invoke(app, {"messages": [("user", "refund 7")]}, {"durability": "sync"})
    assert result.final_text == "done"


@pytest.mark.crash_matrix(framework="langgraph")
def test_bare(crash_run, effects):
    app = build_agent(crash_run.langgraph_checkpointer, effects)
    assert crash_run.invoke(app, REQUEST, {"durability": "sync"}).final_text == FINAL
"""
CONFTEST = """
import os
from tests.langgraph_mutants import apply

apply(os.environ.get("REPLAYSAFE_MUTANT"))
"""
#: What each mutant must be caught by: a part of its violation cells' detail that names the cause.
CAUSES = {
    "lg_ledger_read_ignored": "executed 2 times",
    # the second turn's call_0 replays the first turn's record, whose result message has the first turn's id:
    # LangGraph's add_messages replaces that message by id, and one turn's call is left without a result
    "lg_key_from_call_id": "lost results for ['call_0']",
    "lg_record_never_written": "after its record was said to be written, yet no record was",
    # the witness reads the key in the tool's own context (its callbacks): not the one the ledger reported
    "lg_body_key_unstable": "was given an idempotency key the runtime did not report",
    # the witness reads open_ticket's metadata itself: the runtime's events say no effect class
    "lg_declarations_dropped": "its tool declares effect idempotent with in-doubt policy none, yet the runtime",
    # the witness saw the tool's own ToolMessage.status: a replay of the record answers a success
    "lg_error_recorded_as_success": "was answered as a success although its body raised",
    # the effect is counted in the ledger's database, outside the run: it committed without its record
    "lg_tool_commits_alone": "its writes did not commit with its ledger record",
    # the retention job between the kill and the resume deleted the records of calls LangGraph runs again
    "lg_prune_forgets_unseen_threads": "was gone at the resume: the retention job ran between them",
    # every resumer goes on past the pause: the model's next turn asks anew in each (a new message id each)
    "lg_resume_once_unlocked": "send_email was called for",
}
#: The modes a mutant's matrix runs in, where the default ones do not show it.
MUTANT_MODES = {"lg_prune_forgets_unseen_threads": "prune"}
#: The test of TESTS a mutant's matrix runs, where the wrapper's own do not show it.
MUTANT_TESTS = {"lg_resume_once_unlocked": "test_approved"}
FAILING = ("violation", "resume_failed", "error", "failed", "vacuous")


def _matrix(args: list[str], cwd: Path, report: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """``pytest --crash-matrix`` on SQLite with seed 1, in a process of its own: its exit, cells and output."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--crash-matrix", "--crash-backends=sqlite",
         "--crash-seed=1", f"--crash-report={report}", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert report.exists(), f"{args}: no report\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return {"exit": proc.returncode, "cells": json.loads(report.read_text())["cells"], "out": proc.stdout}


def run_matrix(workdir: Path, test: str | None = None, mutant: str | None = None) -> dict[str, Any]:
    """The matrix over *test* (None: every test of TESTS), in a process of its own (a mutant patches the wrapper)."""
    folder = workdir / f"{(test or 'all').replace(' ', '_')}-{mutant or 'control'}"
    folder.mkdir()
    (folder / "test_lg_agent.py").write_text(TESTS)
    (folder / "conftest.py").write_text(CONFTEST)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REPLAYSAFE_MUTANT": mutant or ""}
    select = ["-k", test] if test else []
    if mutant:  # (a mutant's cause shows in any completion order: one is enough, and halves its matrix)
        select.append("--crash-orders=1")
    if mutant in MUTANT_MODES:
        select.append(f"--crash-modes={MUTANT_MODES[mutant]}")
    if mutant in MUTANT_TESTS:
        select[1] = MUTANT_TESTS[mutant]
    return {**_matrix(["-p", "no:xdist", *select, "test_lg_agent.py"], folder, folder / "report.json", env),
            "mutant": mutant}  # fmt: skip


def run_example(workdir: Path) -> dict[str, Any]:
    """The command docs/langgraph.md gives for its table, as it gives it: the example, on SQLite, seed 1."""
    report = workdir / "langgraph-matrix.json"
    return {**_matrix(["examples/langgraph_support"], ROOT, report), "report": report}


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The example's matrix (the correct wrapper: its table in docs/langgraph.md) beside one over the bare node
    and the wrapper under LangGraph's default durability, in two processes at once."""
    workdir = tmp_path_factory.mktemp("lg-gate")
    with ThreadPoolExecutor(max_workers=2) as pool:
        example = pool.submit(run_example, workdir)
        others = pool.submit(run_matrix, workdir, "test_bare or async_durability or tool_error")
        return {"example": example.result(), **others.result()}


def of_test(result: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [c for c in result["cells"] if f"::{name}[" in c["test"]]


def outcomes(cells: list[dict[str, Any]]) -> dict[str, int]:
    found: dict[str, int] = {}
    for c in cells:
        found[c["outcome"]] = found.get(c["outcome"], 0) + 1
    return found


@pytest.mark.xdist_group("langgraph-gate")  # (one worker builds the control matrix, not each)
def test_a_bare_tool_node_fails_the_gate_and_replay_safe_tool_node_passes(control: dict[str, Any]) -> None:
    assert control["exit"] != 0  # (the bare node's violations fail the run)
    bare = of_test(control, "test_bare")
    sibling = [c for c in bare if c["outcome"] == "violation" and "no ledger recorded it" in c["detail"]]
    assert {c["mode"] for c in sibling} >= {"inprocess", "sigkill"}, outcomes(bare)
    assert any("refund_order(amount=20.0, order_id='1042') executed 2 times" in c["detail"] for c in sibling)
    assert all(c["repro"].startswith("pytest 'test_lg_agent.py::test_bare[") for c in sibling)
    assert "--crash-hits=" in sibling[0]["repro"] and sibling[0]["repro"] in control["out"]
    assert {c["point"] for c in sibling} >= {"tool.before_invoke", "tool.after_return"}

    example = control["example"]
    assert example["exit"] == 0, example["out"][-3000:]  # (the example's bare node is an expected failure)
    safe = of_test(example, "test_replay_safe_tool_node")
    assert safe and not [c for c in safe if c["outcome"] in FAILING]
    gaps = {g for c in safe if c["outcome"] == "known_gap" for g in c["gap"].split(",")}
    assert gaps == {"in_flight", "after_return"}
    assert {c["mode"] for c in safe if c["outcome"] == "protected"} == {"inprocess", "sigkill", "stream"}
    points = {c["point"] for c in safe if c["outcome"] == "protected"}
    assert points >= {"langgraph.after_put_writes", "langgraph.before_put", "langgraph.after_put", "tool.after_record"}


@pytest.mark.xdist_group("langgraph-gate")  # (one worker builds the control matrix, not each)
def test_the_examples_matrix_gives_the_table_docs_langgraph_shows(control: dict[str, Any]) -> None:
    """docs/langgraph.md's before/after table is what its command gives today (a stale figure fails here)."""
    assert check_langgraph(control["example"]["report"]) == []
    bare = of_test(control["example"], "test_bare_tool_node")
    assert any(c["outcome"] == "violation" for c in bare)  # (the table's "before": counted, not hidden by xfail)


@pytest.mark.xdist_group("langgraph-gate")  # (one worker builds the control matrix, not each)
def test_a_failing_tools_error_is_recorded_and_replayed_as_an_error(control: dict[str, Any]) -> None:
    """The control for the error rule: a tool whose ToolMessage says error, under the wrapper, passes every cell."""
    cells = of_test(control, "test_replay_safe_tool_error")
    assert cells and not [c for c in cells if c["outcome"] in FAILING], outcomes(cells)


@pytest.mark.xdist_group("langgraph-gate")  # (one worker builds the control matrix, not each)
def test_with_async_durability_a_model_turn_lost_before_its_tools_ran_shows_and_names_the_fix(
    control: dict[str, Any],
) -> None:
    """LangGraph's default durability saves a step's checkpoint while the next step runs: a kill before the model's
    step is saved loses the AIMessage whose calls had started; the model, asked again, sends new ids. The ledger
    cannot know the new calls are the old ones: the matrix says so, and names durability='sync'."""
    cells = of_test(control, "test_replay_safe_async_durability")
    asked = [c for c in cells if c["outcome"] == "violation" and "invoke with durability='sync'" in c["detail"]]
    assert asked, outcomes(cells)
    assert {c["point"] for c in asked} & {"langgraph.before_put", "langgraph.after_put", "langgraph.after_put_writes"}


def test_every_wrapper_mutant_is_caught_for_its_own_reason(tmp_path: Path) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda m: run_matrix(tmp_path, "test_replay_safe and not async", m), LG_MUTANTS))
    assert set(CAUSES) == set(LG_MUTANTS)
    missed = {}
    for r in results:
        caught = [c for c in r["cells"] if c["outcome"] == "violation" and CAUSES[r["mutant"]] in c["detail"]]
        print(f"  {r['mutant']:28} {len(caught):4} cells: {CAUSES[r['mutant']]!r}")
        if len(caught) < 2 or r["exit"] == 0:
            missed[r["mutant"]] = sorted({c["detail"][:160] for c in r["cells"] if c["outcome"] in FAILING})[:3]
    assert not missed, f"wrapper mutants the matrix did not catch for their own reason: {missed}"


@pytest.mark.xdist_group("langgraph-gate")  # (one worker builds the control matrix, not each)
def test_langgraphs_background_save_is_played_on_purpose_and_its_gap_named(control: dict[str, Any]) -> None:
    """LangGraph saves a task's writes in a background thread and goes on (durability='sync' too): at
    ``langgraph.late_put_writes`` the kill waits for a later tool call's return, in every cell, not by chance. The
    held call runs again on resume: the wrapper's known gap (named for LangGraph's race), the bare node's too
    (and its finished siblings again: violations, as its threads race), the transactional refund once."""
    late = "langgraph.late_put_writes"
    safe = [c for c in of_test(control["example"], "test_replay_safe_tool_node") if c["point"] == late]
    assert {c["mode"] for c in safe} == {"inprocess", "sigkill", "stream"} and len(safe) == 3 * 8
    assert {c["hit"] for c in safe} == {1, 2, 3, 4}  # (the saves a later tool call's return followed)
    for cell in safe:
        assert cell["outcome"] == "known_gap" and "after_return" in cell["gap"].split(","), cell["detail"]
        assert "background thread" in cell["gap_reasons"]["after_return"]
        steps = [(s["phase"], s["kind"]) for s in cell["timeline"]]
        crash = steps.index(("crash", "crash"))
        assert ("run", "end") in steps[:crash] and "AGAIN" in str(cell["timeline"][crash + 1 :])
    bare = [c for c in of_test(control["example"], "test_bare_tool_node") if c["point"] == late]
    assert bare and all(c["outcome"] in ("violation", "known_gap") for c in bare), outcomes(bare)  # (run again)
    made = [c for c in of_test(control["example"], "test_transactional_refund") if c["point"] == late]
    assert made and all(c["outcome"] in ("known_gap", "exactly_once") for c in made), outcomes(made)
