"""docs/crash-matrix.md's GitHub Actions workflow and Kubernetes Indexed Job, run as far as one machine can.

The workflow: its shard job's ``run:`` commands for every value of its job matrix, the two artifact actions
played by copying files as they would, then the gate job's commands (the merge). The manifest: its container's
command line with ``JOB_COMPLETION_INDEX`` set to each index of ``completions``, then the merge the docs give.
Both run a small project of marked tests in a folder of their own (``pip install`` steps are left out: this venv is
the install). Both merges must have the cells and outcomes of one unsharded run with the same seed, and a
missing shard must fail the gate."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import ROOT

DOC = ROOT / "docs" / "crash-matrix.md"
PROJECT = '''
import pytest
from tenxgraph import Message, ReactAgent, Reply, ScriptedModel


def build(checkpointer, effects, kind):
    def act(order_id: str, idempotency_key: str) -> str:
        """Act on an order."""
        return str(effects.apply(kind, {"order": order_id}, idempotency_key=idempotency_key)["effect_id"])

    def look(order_id: str) -> str:
        """Look an order up."""
        return "delivered"

    model = ScriptedModel([
        Reply(tool_calls=[("look", {"order_id": "7"}), ("act", {"order_id": "7"})]),
        "Done.",
    ])
    return ReactAgent(model, tools=[act, look]).compile(checkpointer=checkpointer)


@pytest.mark.crash_matrix(backends=["memory", "sqlite"])
@pytest.mark.parametrize("kind", ["refund", "email", "ticket"])
def test_once(crash_run, effects, kind):
    app = build(crash_run.checkpointer, effects, kind)
    assert crash_run.invoke(app, {"messages": [Message.text_message("go")]}).final_text == "Done."
    assert effects.count(kind, thread_id=crash_run.thread_id) == 1
'''


def section_yaml(heading: str) -> dict[str, Any]:
    text = DOC.read_text()
    start = text.index(heading)
    block = re.search(r"```yaml\n(.*?)```", text[start:], re.S)
    assert block is not None, f"no yaml block after {heading!r} in {DOC}"
    loaded = yaml.safe_load(block.group(1))
    assert isinstance(loaded, dict)
    return loaded


def shell(command: str, cwd: Path, env: dict[str, str] | None = None, status: int = 0) -> str:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # (pytest and python: this venv's)
    result = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env={**os.environ, "PATH": path, **(env or {})},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == status, (command, result.stdout[-3000:], result.stderr[-2000:])
    return result.stdout


def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    (folder / "tests").mkdir(parents=True)
    (folder / "tests" / "test_once.py").write_text(PROJECT)
    (folder / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")
    return folder


def outcomes(path: Path) -> Counter[tuple[str, ...]]:
    cells = json.loads(path.read_text())["cells"]
    return Counter((c["test"], str(c["hit"]), str(c.get("order")), c["outcome"], str(c.get("gap"))) for c in cells)


def expand(value: Any, shard: object) -> Any:
    if isinstance(value, str):
        return value.replace("${{ matrix.shard }}", str(shard))
    if isinstance(value, dict):
        return {k: expand(v, shard) for k, v in value.items()}
    return value


def play(steps: list[dict[str, Any]], cwd: Path, artifacts: Path) -> None:
    """The steps a runner would run: ``run:`` commands in the checkout, artifacts uploaded to and downloaded
    from *artifacts* (checkout, setup-python and installs are this machine's already)."""
    for step in steps:
        uses, run = str(step.get("uses", "")), step.get("run")
        if uses.startswith("actions/upload-artifact"):
            into = artifacts / step["with"]["name"]
            into.mkdir(parents=True)
            for found in cwd.glob(step["with"]["path"]):
                shutil.copy(found, into)
        elif uses.startswith("actions/download-artifact"):
            into = cwd / step["with"]["path"]
            into.mkdir(parents=True, exist_ok=True)
            assert step["with"].get("merge-multiple") is True  # (else each artifact has a folder of its own)
            for named in sorted(artifacts.iterdir()):
                if fnmatch.fnmatch(named.name, step["with"]["pattern"]):
                    for found in named.iterdir():
                        shutil.copy(found, into)
        elif run is not None and not str(run).startswith("pip install"):
            shell(str(run), cwd)


@pytest.fixture(scope="module")
def unsharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = project(tmp_path_factory.mktemp("whole"))
    shell("pytest --crash-matrix -n 2 --crash-seed=1 --crash-report=whole.json", folder)
    return folder / "whole.json"


@pytest.mark.xdist_group("shard-recipes")  # (one worker builds the module's matrices)
def test_the_github_actions_workflow_shards_merges_and_gates(tmp_path: Path, unsharded: Path) -> None:
    jobs = section_yaml("### GitHub Actions: a job matrix over K")["jobs"]
    shards, gate = jobs["crash-matrix"], jobs["crash-matrix-gate"]
    assert gate["needs"] == "crash-matrix" and shards["strategy"]["fail-fast"] is False
    values = shards["strategy"]["matrix"]["shard"]
    artifacts = tmp_path / "artifacts"
    for k in values:  # each job on a runner of its own: a fresh checkout
        play([expand(step, k) for step in shards["steps"]], project(tmp_path / f"runner-{k}"), artifacts)
    merger = project(tmp_path / "runner-gate")
    play(gate["steps"], merger, artifacts)
    assert outcomes(merger / "crash-matrix.json") == outcomes(unsharded)
    assert (merger / "crash-matrix.html").exists() and len(values) == 4
    plans = {json.loads(p.read_text())["shard"]["plan"] for p in (merger / "shards").glob("*.json")}
    assert len(plans) == 1
    (merger / "shards" / "shard-2.json").unlink()  # a shard job that wrote nothing
    merge = next(str(s["run"]) for s in gate["steps"] if "merge" in str(s.get("run", "")))
    assert "shard(s) 2/4 of plan" in shell(merge, merger, status=2)  # the gate job fails


@pytest.mark.xdist_group("shard-recipes")  # (one worker builds the module's matrices)
def test_the_kubernetes_indexed_job_shards_by_its_completion_index(tmp_path: Path, unsharded: Path) -> None:
    job = section_yaml("### Kubernetes: an Indexed Job")
    spec = job["spec"]
    assert job["kind"] == "Job" and spec["completionMode"] == "Indexed"
    container = spec["template"]["spec"]["containers"][0]
    command = container["command"]
    assert command[:2] == ["sh", "-c"]
    reports = tmp_path / "reports"
    reports.mkdir()
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["REPORT_DIR"] == container["volumeMounts"][0]["mountPath"]
    folder = project(tmp_path)
    for index in range(spec["completions"]):  # one pod per index, each its own process
        shell(command[2], folder, {"JOB_COMPLETION_INDEX": str(index), "REPORT_DIR": str(reports)})
    text = DOC.read_text()
    merge = re.search(r"`(python -m pytest_replaysafe merge /reports/[^`]+)`", text)
    assert merge is not None, "the docs give the Indexed Job's merge command"
    shell(merge.group(1).replace("/reports", str(reports)), folder)
    assert outcomes(reports / "crash-matrix.json") == outcomes(unsharded)
