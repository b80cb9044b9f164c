"""``--crash-shard=K/N`` and ``python -m pytest_replaysafe merge``: one plan split into disjoint shards, run as
separate processes (as separate machines would, on one PostgreSQL), merged into the report one unsharded run of
the same seed writes; a merge that would not equal it is refused, naming the shard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pytest_replaysafe.matrix.shards import Item, Shard, ShardError, assign, digest, group_of
from pytest_replaysafe.report.merge import main as merge_main
from tests.helpers import ROOT

EXAMPLES = ["examples/support_refund", "examples/parallel_tools"]
BACKENDS = "memory,sqlite" + (",postgres" if os.environ.get("REPLAYSAFE_PG_DSN") else "")
MATRIX = ["--crash-matrix", "--crash-hits=1", f"--crash-backends={BACKENDS}", "--crash-seed=7"]


def pytest_run(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "pytest", *EXAMPLES, "-p", "no:cacheprovider", "-q", *MATRIX, *args]
    env = {**os.environ, **(env or {})}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finished(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode in (0, 1), out[-3000:]  # (1: the examples' xfailed "before" tests do not fail a run)
    return out


def outcomes(report: dict[str, Any]) -> Counter[tuple[str, ...]]:
    return Counter(
        (c["test"], str(c["hit"]), str(c.get("order")), str(c.get("then")), c["outcome"], str(c.get("gap")))
        for c in report["cells"]
    )


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """One unsharded run (two xdist workers) and the same plan as four shard processes at once, on one
    PostgreSQL under one REPLAYSAFE_MATRIX_SCHEMA name (each shard adds its own suffix)."""
    out = tmp_path_factory.mktemp("shards")
    whole = pytest_run("-n", "2", f"--crash-report={out / 'whole.json'}")
    finished(whole)
    schema = {"REPLAYSAFE_MATRIX_SCHEMA": f"rst_{uuid.uuid4().hex[:10]}"}
    procs = [
        pytest_run(f"--crash-shard={k}/4", f"--crash-report={out / f'shard-{k}.json'}", env=schema) for k in range(1, 5)
    ]
    for proc in procs:
        finished(proc)
    return out / "whole.json", [out / f"shard-{k}.json" for k in range(1, 5)]


@pytest.mark.xdist_group("shards")  # (one worker builds the module's matrices)
def test_four_shards_merged_equal_one_unsharded_run(
    shards: tuple[Path, list[Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole_path, parts = shards
    reports = [json.loads(p.read_text()) for p in parts]
    items = [nodeid for r in reports for nodeid in r["shard"]["items"]]
    assert len(items) == len(set(items)) == reports[0]["shard"]["total"]  # each item in exactly one shard
    assert len({r["shard"]["plan"] for r in reports}) == 1 and all(r["shard"]["items"] for r in reports)
    assert merge_main([*map(str, parts), "--out", str(tmp_path / "m.json"), "--html", str(tmp_path / "m.html")]) == 0
    printed = capsys.readouterr().out
    whole, merged = json.loads(whole_path.read_text()), json.loads((tmp_path / "m.json").read_text())
    assert outcomes(merged) == outcomes(whole) and len(merged["cells"]) > 100
    for key in ("seed", "summary", "coverage", "failed_at_known_gap"):
        assert merged[key] == whole[key], key
    calls = {(r["tool"], r["backend"]): r["calls"] for r in whole["exposure"]["rows"]}
    assert {(r["tool"], r["backend"]): r["calls"] for r in merged["exposure"]["rows"]} == calls
    assert "proved:" in printed and "merged from 4 shards" in printed
    page = (tmp_path / "m.html").read_text()  # (the page carries every cell, for its grid and timelines)
    assert all(json.dumps(c["test"])[1:-1] in page for c in whole["cells"])


@pytest.mark.xdist_group("shards")  # (one worker builds the module's matrices)
def test_a_missing_doubled_foreign_or_unfinished_shard_is_refused_by_name(
    shards: tuple[Path, list[Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, parts = shards
    out = ["--out", str(tmp_path / "m.json")]
    assert merge_main([*map(str, parts[:3]), *out]) == 2
    assert "shard(s) 4/4 of plan" in capsys.readouterr().out and not (tmp_path / "m.json").exists()
    assert merge_main([*map(str, parts), str(parts[1]), *out]) == 2
    assert f"shard 2 is given twice: {parts[1]} and {parts[1]}" in capsys.readouterr().out
    data = json.loads(parts[2].read_text())
    data["shard"]["plan"] = "0" * 16  # (as a shard run with another seed, option or collection would be)
    (tmp_path / "other.json").write_text(json.dumps(data))
    assert merge_main([str(parts[0]), str(parts[1]), str(tmp_path / "other.json"), str(parts[3]), *out]) == 2
    assert f"{tmp_path / 'other.json'} (shard 3/4) is of plan 0000000000000000" in capsys.readouterr().out
    data = json.loads(parts[2].read_text())
    data["shard"]["unfinished"] = data["shard"]["items"][-2:]
    (tmp_path / "short.json").write_text(json.dumps(data))
    assert merge_main([str(parts[0]), str(parts[1]), str(tmp_path / "short.json"), str(parts[3]), *out]) == 2
    assert "did not finish 2 of its" in capsys.readouterr().out
    whole = shards[0]
    assert merge_main([str(whole), *out]) == 2
    assert "not a shard's report (no 'shard')" in capsys.readouterr().out


@pytest.mark.xdist_group("shards")  # (one worker builds the module's matrices)
def test_a_failing_cell_fails_the_merge(shards: tuple[Path, list[Path]], tmp_path: Path) -> None:
    _, parts = shards
    data = json.loads(parts[0].read_text())
    held = next(c for c in data["cells"] if c["outcome"] == "protected")
    held.update(outcome="violation", detail="refund_order executed 2 times")
    (tmp_path / "bad.json").write_text(json.dumps(data))
    assert merge_main([str(tmp_path / "bad.json"), *map(str, parts[1:]), "--out", str(tmp_path / "m.json")]) == 1


def test_a_shard_needs_a_seed_the_matrix_and_a_k_of_n() -> None:
    run = [sys.executable, "-m", "pytest", EXAMPLES[0], "-p", "no:cacheprovider", "-q"]
    cases = {
        ("--crash-matrix", "--crash-shard=1/2"): "give the seed as a number (--crash-seed=N)",
        ("--crash-seed=1", "--crash-shard=1/2"): "--crash-shard splits the crash matrix: give --crash-matrix too",
        ("--crash-matrix", "--crash-seed=1", "--crash-shard=3/2"): "K must be 1 to N",
        ("--crash-matrix", "--crash-seed=1", "--crash-shard=2"): "give K/N, shard K of N counted from 1",
        ("--crash-matrix", "--crash-seed=1", "--crash-shard-costs=x.json"): "give --crash-shard=K/N too",
    }
    for args, message in cases.items():
        result = subprocess.run([*run, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode == 4 and message in result.stderr, (args, result.stderr[-500:])


def items(tests: int, backends: int, per: int) -> list[Item]:
    return [
        Item(f"t.py::test_{t}[p{i}-b{b}-inprocess]", group_of(f"t.py::test_{t}[p{i}-b{b}-inprocess]", f"b{b}"))
        for t in range(tests)
        for b in range(backends)
        for i in range(per)
    ] + [Item(f"t.py::test_plain_{n}", group_of(f"t.py::test_plain_{n}", None)) for n in range(3)]


def test_every_item_is_in_exactly_one_shard_and_the_plan_is_the_same_everywhere() -> None:
    found = items(5, 3, 4)
    for count in range(1, 7):
        shard_of = assign(found, count)
        assert set(shard_of) == {i.nodeid for i in found} and set(shard_of.values()) <= set(range(1, count + 1))
        assert assign(list(reversed(found)), count) == shard_of  # another machine, the same items in another order
        loads = Counter(shard_of.values())
        assert max(loads.values()) - min(loads.values()) <= 4, loads  # (a group of 4 is the unit)
    shard_of = assign(found, 4)
    for t in range(5):  # a test's items on one backend stay together (each group is under half a share)
        assert len({shard_of[f"t.py::test_{t}[p{i}-b0-inprocess]"] for i in range(4)}) == 1


def test_a_big_group_is_cut_and_measured_costs_balance_the_shards() -> None:
    big = items(1, 1, 40)
    assert len(set(assign(big, 4).values())) == 4  # one test on one backend still spreads over every shard
    found = items(4, 1, 5)
    costs = {i.nodeid: (30.0 if "test_0[" in i.nodeid else 1.0) for i in found}
    shard_of = assign(found, 2, costs)
    spent = Counter({k: 0.0 for k in (1, 2)})
    for nodeid, k in shard_of.items():
        spent[k] += costs.get(nodeid, 1.0)
    assert max(spent.values()) <= 0.6 * sum(spent.values()), spent  # unweighted, test_0 alone would be 150 of 168
    assert shard_of != assign(found, 2)  # the costs changed the plan...
    options = {"seed": 1}
    assert digest(options, 2, shard_of) != digest(options, 2, assign(found, 2))  # ...and so its name
    assert digest({"seed": 2}, 2, shard_of) != digest(options, 2, shard_of)


def test_the_shard_option_parses() -> None:
    assert Shard.parse(" 2/4 ") == Shard(2, 4) and str(Shard(2, 4)) == "2/4"
    for bad in ("0/4", "5/4", "2", "a/b", "1/0"):
        with pytest.raises(ShardError, match="--crash-shard"):
            Shard.parse(bad)
