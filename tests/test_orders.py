"""Completion orders of parallel calls as a matrix dimension: with ``--crash-orders=all`` every subset of a batch's
siblings is, in some cell, exactly the set recorded when the crash fired; each cell's repro line brings it back."""

from __future__ import annotations

import itertools
import json
import os
import random
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_replaysafe.matrix.orders import Orders

ROOT = Path(__file__).resolve().parents[1]


def test_orders_parse_and_plan() -> None:
    assert Orders.parse(None, None) == Orders(2, None)  # single file, and every call together
    assert Orders.parse("all", None).count is None and Orders.parse("3", "2") == Orders(3, 2)
    for bad in ("0", "many"):
        with pytest.raises(pytest.UsageError, match="--crash-orders"):
            Orders.parse(bad, None)
    with pytest.raises(pytest.UsageError, match="--crash-order="):
        Orders.parse("all", "-1")
    assert Orders(None).variants(3) == list(range(7)) and Orders(None).variants(9) == list(range(25))  # + together
    assert Orders(3).variants(2) == [0, 1, 2] and Orders(None).variants(1) == [0]  # nothing parallel: one order
    assert Orders(None, only=5).variants(3) == [5] and Orders().variants(3) == [0, 1]
    assert Orders(1).flag(0, parallel=False) == "" and Orders(None).flag(0) == " --crash-orders=all --crash-order=0"
    assert Orders().flag(0, parallel=False) == "" and Orders().flag(1) == " --crash-order=1"
    assert Orders().flag(0) == " --crash-order=0"  # a default run of a parallel test has orders 0 and 1


def test_all_orders_are_every_permutation_and_drawn_orders_are_seeded() -> None:
    every = Orders(None)
    picked = {tuple(g[0] for g in every.pick([0, 1, 2], v, random.Random(1))) for v in (0, 2, 3, 4, 5, 6)}
    assert picked == set(itertools.permutations([0, 1, 2]))
    assert every.pick([0, 1, 2], 1, random.Random(1)) == [[0, 1, 2]] == Orders().pick([0, 1, 2], 1, random.Random(1))
    drawn = Orders(6)
    assert drawn.pick([0, 1, 2, 3], 2, random.Random(7)) == drawn.pick([0, 1, 2, 3], 2, random.Random(7))
    assert drawn.pick([0, 1, 2, 3], 0, random.Random(7)) == Orders(1).pick([0, 1, 2, 3], 0, random.Random(7))
    grouped = [drawn.pick([0, 1, 2, 3], v, random.Random(7)) for v in range(2, 6)]
    assert all(sorted(i for g in groups for i in g) == [0, 1, 2, 3] for groups in grouped)
    assert any(len(g) > 1 for groups in grouped for g in groups)  # seeded groupings: siblings returning together


def matrix(tmp_path: Path, name: str, *args: str) -> list[dict[str, object]]:
    path = tmp_path / f"{name}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--crash-matrix", "--crash-seed=11"]
    command += ["--crash-backends=sqlite", "--crash-modes=inprocess", f"--crash-report={path}", *args]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    return json.loads(path.read_text())["cells"]  # type: ignore[no-any-return]


def recorded_before_crash(cell: dict[str, object]) -> frozenset[str]:
    timeline = cell["timeline"]
    assert isinstance(timeline, list)
    return frozenset(e["text"].split("(")[0] for e in timeline if e["phase"] == "run" and e["kind"] == "recorded")


def test_every_subset_of_siblings_is_the_recorded_one_in_some_cell(tmp_path: Path) -> None:
    target = "examples/parallel_tools"
    one = matrix(tmp_path, "one", target, "--crash-points=tool.after_record")
    every = matrix(tmp_path, "all", target, "--crash-points=tool.after_record", "--crash-orders=all")
    tools = {"refund_order", "send_email", "open_ticket"}
    for hit in (1, 2):  # the crash fires at the hit-th record: hit siblings recorded (single file)
        seen = {recorded_before_crash(c) for c in every if c["hit"] == hit and c["order"] != 1}
        assert seen == {frozenset(s) for s in itertools.combinations(sorted(tools), hit)}
        single = {recorded_before_crash(c) for c in one if c["hit"] == hit and c["order"] == 0}
        assert len(single) == 1  # one order: one subset
    together = [c for c in every if c["order"] == 1]  # one group commit: the first record is all three
    assert together and all(recorded_before_crash(c) == frozenset(tools) for c in together)
    assert {c["order"] for c in every} == set(range(7)) and {c["order"] for c in one} == {0, 1}
    cell = next(c for c in every if c["hit"] == 2 and c["order"] == 4)
    repro = shlex.split(str(cell["repro"]))[1:]  # replay that one cell
    again = matrix(tmp_path, "again", *[a for a in repro if not a.startswith("--crash-seed")])
    assert len(again) == 1 and again[0]["order"] == 4 and again[0]["outcome"] == cell["outcome"]
    assert recorded_before_crash(again[0]) == recorded_before_crash(cell)


def test_a_bug_one_order_can_miss_is_caught_when_every_order_runs(tmp_path: Path) -> None:
    """tests/mutants.py ledger_read_prefix_only replays only up to the first unrecorded call in message order. At
    seed 15 the one seeded order of each hit records a prefix of the batch, so the default matrix passes it; with
    every order, some cell records a non-prefix set and the resume runs a recorded call again."""
    (tmp_path / "conftest.py").write_text(
        "import os\nfrom tests.mutants import apply\n\napply('ledger_read_prefix_only')\n"
    )
    (tmp_path / "test_p.py").write_text((ROOT / "examples/parallel_tools/test_parallel_tools.py").read_text())
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "PYTHONPATH": str(ROOT)}

    def violations(*args: str) -> int:
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", "no:xdist"]
        command += ["--crash-matrix", "--crash-backends=sqlite", "--crash-modes=inprocess", "--crash-seed=15"]
        command += ["--crash-points=tool.after_record", "--crash-report=r.json", *args, "test_p.py"]
        subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        return int(json.loads((tmp_path / "r.json").read_text())["summary"]["violation"])

    assert violations("--crash-orders=1") == 0
    assert violations("--crash-orders=all") > 0
