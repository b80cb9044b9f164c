"""Crashes during recovery (``--crash-depth=2``): schedules of two crashes, judged over the whole schedule; the
budget; the repro and replay of one schedule; and a broken runtime only a crash during the resume shows."""

from __future__ import annotations

import json
import os
import random
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pytest_replaysafe.judge.evidence import Entry, unfinished_since
from pytest_replaysafe.judge.gaps import KNOWN_GAPS
from pytest_replaysafe.judge.verdict import HitEvidence, Reference, judge
from pytest_replaysafe.matrix.schedules import (
    DEFAULT_BUDGET,
    REPLAY_PATH,
    Depth,
    SecondCrash,
    candidates,
    choose,
    smaller,
)
from tests import browser

ROOT = Path(__file__).resolve().parents[1]
PARALLEL = ROOT / "examples/parallel_tools/test_parallel_tools.py"


def matrix(folder: Path, mutant: str | None, *args: str) -> dict[str, Any]:
    """The parallel-tools example's matrix on SQLite in a process of its own (a mutant patches the runtime)."""
    folder.mkdir(exist_ok=True)
    (folder / "conftest.py").write_text(f"from tests.mutants import apply\n\napply({mutant!r})\n")
    (folder / "test_p.py").write_text(PARALLEL.read_text())
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", "no:xdist", "--crash-matrix"]
    command += ["--crash-backends=sqlite", "--crash-seed=1", "--crash-report=r.json", *args]
    if not any(a.startswith("--crash-replay") or a.startswith("test_p.py") for a in args):
        command.append("test_p.py")
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    report = folder / "r.json"
    assert report.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    data: dict[str, Any] = json.loads(report.read_text())
    data["stdout"] = done.stdout
    return data


def violations(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in data["cells"] if c["outcome"] == "violation"]


def test_schedules_are_learned_from_the_resume_and_chosen_under_the_budget() -> None:
    counts = {(1, 0): {"tool.before_ledger_read": 2, "ledger.read_error": 2, "node.after_complete": 3}}
    plans = candidates([(1, 0), (2, 0)], counts)
    # crash points only (a fault point is not a second crash), every hit the resume reached; hit 2 reached none
    assert [str(p[2]) for p in plans] == [
        "node.after_complete@1", "node.after_complete@2", "node.after_complete@3",
        "tool.before_ledger_read@1", "tool.before_ledger_read@2",
    ]  # fmt: skip
    everything = choose(plans, Depth(2, None), random.Random(1))
    assert everything.plans == plans and (everything.enumerated, everything.sampled) == (5, 0)
    small = choose(plans, Depth(2, 3), random.Random(1))
    always = {p for p in plans if p[2] is not None and p[2].hit == 1 and p[2].point in REPLAY_PATH}
    assert always <= set(small.plans) and len(small.plans) == 3 and (small.enumerated, small.sampled) == (2, 1)
    assert choose(plans, Depth(2, 3), random.Random(1)).plans == small.plans  # seeded
    only = choose(plans, Depth(2, 3, SecondCrash("node.after_complete", 2)), random.Random(1))
    assert [str(p[2]) for p in only.plans] == ["node.after_complete@2"]
    assert Depth.parse(None, None, None) == Depth(1, DEFAULT_BUDGET)
    assert Depth.parse("2", "all", None) == Depth(2, None)
    assert Depth.parse(None, None, "tool.after_record@2").depth == 2  # a schedule's repro implies depth 2
    for bad in (("3", None, None), ("0", None, None), (None, "-1", None), (None, None, "tool.after_record")):
        with pytest.raises(pytest.UsageError, match="--crash-"):
            Depth.parse(*bad)


def test_a_failing_schedule_has_smaller_ones_to_try_where_the_resume_reached_them() -> None:
    counts = {(1, 1): {"tool.before_invoke": 3}, (2, 1): {"tool.before_invoke": 1}, (3, 1): {"tool.before_invoke": 3}}
    failing = (3, 1, SecondCrash("tool.before_invoke", 3))
    steps = [(h, o, str(t)) for h, o, t in smaller(failing, counts)]
    # an earlier first hit (hit 2's resume never reached a third arrival; order 0 of hit 3 was never learned),
    # then earlier arrivals of the second point, smallest first
    assert steps == [(1, 1, "tool.before_invoke@3"), (3, 1, "tool.before_invoke@1"), (3, 1, "tool.before_invoke@2")]
    assert smaller((1, 0, SecondCrash("tool.before_invoke", 1)), counts) == []  # already the smallest


def entry(event: str, call: str = "m:0", tool: str = "refund") -> Entry:
    return Entry("t", f"key-{call}", event, tool=tool, call=call, fp="x" if event == "end" else None)


def test_each_crash_allows_one_more_run_of_the_call_it_left_unfinished_and_no_more() -> None:
    ref = Reference([], "done", Counter({"refund": 1}), Counter())
    log = [entry("start"), entry("start"), entry("end")]  # in flight at crash 1, ran again
    first = {"m:0": "in_flight"}
    evidence = HitEvidence(True, "m:0", [*log, entry("start"), entry("end")], first, [], "done")
    outcome, gap, detail = judge(evidence, ref, KNOWN_GAPS, "tool.in_flight", "inprocess", "sqlite")
    assert outcome == "violation" and "executed 3 times (its crashes allow 2" in detail  # one crash: twice at most
    evidence.later = [("tool.after_return", "m:0", unfinished_since(log, 1))]  # crash 2 after it returned again
    outcome, gap, _ = judge(evidence, ref, KNOWN_GAPS, "tool.in_flight", "inprocess", "sqlite")
    assert (outcome, gap) == ("known_gap", "after_return,in_flight")
    evidence.later = [("run.before_node", None, unfinished_since(log, 1))]  # a crash outside the tool path
    assert judge(evidence, ref, KNOWN_GAPS, "tool.in_flight", "inprocess", "sqlite")[0] == "violation"
    # a call the resume never reached is not counted again at the second crash
    assert unfinished_since([entry("start"), entry("start", "m:1")], 1) == {"m:1": "in_flight"}


def test_depth_two_runs_two_crashes_per_schedule_and_repeats_one_exactly(tmp_path: Path) -> None:
    data = matrix(  # (one completion order: the replay path alone would fill the budget of two)
        tmp_path / "d2", None, "--crash-depth=2", "--crash-modes=inprocess,sigkill", "--crash-orders=1",
        "--crash-html=m.html",
    )  # fmt: skip
    assert violations(data) == [] and data["summary"]["protected"] > 0
    deep = [c for c in data["cells"] if c["then"]]
    shallow = [c for c in data["cells"] if not c["then"]]
    assert deep and shallow and {c["mode"] for c in deep} == {"inprocess", "sigkill"}
    t = data["schedules"]
    assert t["enumerated"] + t["sampled"] == len(deep) and t["candidates"] > len(deep) and t["sampled"] > 0
    assert t["budget"] == DEFAULT_BUDGET and t["items"] == 2 * 8  # the 8 crash-kind points (no faults), 2 modes
    assert "depth 2: " in data["stdout"] and " sampled by seed" in data["stdout"]
    for c in deep:
        crashes = [e for e in c["timeline"] if e["kind"] == "crash"]
        assert len(crashes) == 2 and crashes[1]["text"].endswith(f"hit {c['then'].split('@')[1]} of the resume")
        assert "--crash-depth=2 --crash-then=" + c["then"] in c["repro"]
    # a call run three times (in flight at the first crash, returned again at the second) is a known gap
    thrice = [c for c in deep if max(c["executions"].values(), default=0) == 3]
    assert thrice and all(c["outcome"] == "known_gap" for c in thrice)
    if browser.chromium() is not None or os.environ.get(browser.ENV_REQUIRE):  # the HTML page shows both crashes
        index = data["cells"].index(deep[0])
        shown = browser.render(tmp_path / "d2" / "m.html", f"cell={index}")
        crashes = [text for phase, text in shown.timeline if phase == "crash"]
        assert len(crashes) == 2 and crashes[1].endswith(" of the resume"), shown.timeline
    one = next(c for c in deep if c["mode"] == "sigkill" and c["hit"] == 2)
    repro = shlex.split(one["repro"])[1:]
    again = matrix(tmp_path / "again", None, *[a for a in repro if not a.startswith("--crash-seed")])
    repeated = [c for c in again["cells"] if c["then"]]
    assert [(c["hit"], c["then"], c["outcome"]) for c in repeated] == [(2, one["then"], one["outcome"])]


def test_a_runtime_that_only_a_crash_during_recovery_breaks_is_caught_at_depth_two(tmp_path: Path) -> None:
    """tests/mutants.py replay_consumes_records deletes the records its ledger read found and writes them back when
    the node's calls are done: every depth-1 cell passes; a second crash before the write-back loses them."""
    assert violations(matrix(tmp_path / "one", "replay_consumes_records")) == []
    caught = matrix(tmp_path / "two", "replay_consumes_records", "--crash-depth=2")
    found = violations(caught)
    assert found and all(c["then"] for c in found)
    assert all("executed 2 times" in c["detail"] for c in found)
    first = caught["stdout"].split("VIOLATION ", 1)[1].splitlines()[0]
    assert " then " in first  # the failure lines name the second crash
    replayed = matrix(tmp_path / "two", "replay_consumes_records", "--crash-replay=r.json")
    again = {(c["test"], c["hit"], c["order"], c["then"]) for c in violations(replayed)}
    key = {(c["test"], c["hit"], c["order"], c["then"]) for c in found}
    # exactly, except at tool.in_flight: which parallel sync tool (each on a thread of its own) reaches its effect
    # third is the threads' race, not the seed's (the seed orders return -> record, not the bodies' start)
    assert {k for k in again if "tool.in_flight" not in k[0]} == {k for k in key if "tool.in_flight" not in k[0]}


def test_after_a_failing_schedule_smaller_ones_run_until_the_smallest_failing_one_is_found(tmp_path: Path) -> None:
    from pytest_replaysafe.judge.outcome import CellResult, Outcome
    from pytest_replaysafe.matrix.cells import Cell
    from pytest_replaysafe.matrix.schedules import Choice
    from pytest_replaysafe.run.harness import CellPlan, CrashRun
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    plan = CellPlan(
        "t.py::test_x[tool.after_return-memory-inprocess]", Cell("tool.after_return", "memory", "inprocess"),
        seed=1, rules=KNOWN_GAPS,
    )  # fmt: skip
    run = CrashRun(plan, InMemoryCheckpointer(), tmp_path).driver
    run.planner.choice = Choice([], 10, 1, 0)
    run.planner.resume_counts = {(1, 0): {"tool.before_invoke": 3}, (2, 0): {"tool.before_invoke": 3}}

    def verdict(plan: tuple[int, int, SecondCrash | None], outcome: Outcome) -> None:
        hit, _, then = plan
        run.results.append(CellResult("t", "tool.after_return", hit, "memory", "inprocess", outcome, then=str(then)))

    verdict((2, 0, SecondCrash("tool.before_invoke", 3)), Outcome.VIOLATION)  # the sampled schedule that failed
    # which smaller schedules fail: an earlier first hit does not; earlier second arrivals do, down to @2
    fails = {(2, 0, "tool.before_invoke@2"), (2, 0, "tool.before_invoke@3")}
    tried = []
    for plan in run.planner.shrink({(2, 0, SecondCrash("tool.before_invoke", 3))}, run._failing_schedules):
        tried.append((plan[0], plan[1], str(plan[2])))
        verdict(plan, Outcome.VIOLATION if tried[-1] in fails else Outcome.PROTECTED)
    assert tried == [
        (1, 0, "tool.before_invoke@3"),  # earlier first hit: passes
        (2, 0, "tool.before_invoke@1"),  # earlier arrival: passes
        (2, 0, "tool.before_invoke@2"),  # fails: the new smallest
        (1, 0, "tool.before_invoke@2"),  # its one untried smaller neighbour: passes; nothing is left
    ]
    assert run.planner.choice.shrunk == 4
    assert sorted(r.then or "" for r in run.results if r.outcome == Outcome.VIOLATION)[0] == "tool.before_invoke@2"
