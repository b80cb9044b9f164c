"""The OpenAI Agents SDK integration (``replay_safe``) and the crash matrix on an agent
(``framework="openai_agents"``): the run replayed from its journal and ledger, bad input refused, the command
docs/openai-agents.md gives for its table (checked here), and broken integrations (pytester), each caught for
its own reason."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from examples.openai_agents_support.agent import FINAL, build_agent, run_support
from pytest_replaysafe.run.effects import Effects
from tenxgraph.storage.checkpointer import InMemoryCheckpointer, SqliteCheckpointer
from tenxgraph.utils.errors import ConfigError
from tests.doc_figures import check_agents

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]


def test_a_resumed_run_replays_its_turns_and_calls_from_another_process(tmp_path: Path) -> None:
    """The same run again, on a new store object over the same file (another process's view): the model's turns
    come from the journal (the same call ids), each call from the ledger, and no effect happens twice."""
    effects = Effects(tmp_path / "effects.db")
    first = asyncio.run(run_support("run-1", "refund A-1042", agent=build_agent(effects),
                                    ledger=SqliteCheckpointer(tmp_path / "ledger.db")))  # fmt: skip
    again = asyncio.run(run_support("run-1", "refund A-1042", agent=build_agent(effects),
                                    ledger=SqliteCheckpointer(tmp_path / "ledger.db")))  # fmt: skip
    assert first == again and first[-1].text == FINAL
    calls = [c.id for m in first for c in m.tool_calls]
    assert len(calls) == 2 and all(m.message_id.startswith("fc_") for m in first if m.tool_calls)
    assert effects.count("refund") == 1 and effects.count("email") == 1


def test_a_run_resumed_with_another_input_is_refused(tmp_path: Path) -> None:
    effects, ledger = Effects(tmp_path / "effects.db"), InMemoryCheckpointer()
    asyncio.run(run_support("run-2", "refund A-1042", agent=build_agent(effects), ledger=ledger))
    with pytest.raises(ConfigError, match="started with another input than this one"):
        asyncio.run(run_support("run-2", "refund B-7", agent=build_agent(effects), ledger=ledger))
    assert effects.count("refund") == 1


def test_bad_declarations_and_models_are_refused_naming_the_fix(tmp_path: Path) -> None:
    from agents import Agent

    from tenxgraph.integrations.openai_agents import replay_safe

    agent = build_agent(Effects(tmp_path / "effects.db"))
    ledger = InMemoryCheckpointer()
    with pytest.raises(ConfigError, match=r"\['refund'\] are not function tools of agent 'support'"):
        replay_safe(agent, ledger=ledger, run_id="r", effects={"refund": "external"})
    with pytest.raises(ValueError, match="on_in_doubt='reconcile' needs reconcile"):
        replay_safe(agent, ledger=ledger, run_id="r", on_in_doubt={"refund_order": "reconcile"})
    with pytest.raises(ConfigError, match=re.escape("names its model by 'gpt-4.1', not an agents.Model: pass")):
        replay_safe(Agent(name="a", model="gpt-4.1"), ledger=ledger, run_id="r")
    with pytest.raises(ConfigError, match="has handoffs"):
        replay_safe(agent.clone(handoffs=[Agent(name="b")]), ledger=ledger, run_id="r")


TEST = """
from functools import partial
import pytest
from examples.openai_agents_support.agent import FINAL, build_agent, run_support

@pytest.mark.crash_matrix(framework="openai_agents",
                          points="openai_agents.after_model_record,tool.after_return,tool.after_record")
def test_agent(crash_run, effects):
    run = partial(run_support, agent=build_agent(effects), ledger=crash_run.checkpointer)
    assert crash_run.invoke(run, {"prompt": "refund A-1042"}).final_text == FINAL
"""
J = "import tenxgraph.integrations.openai_agents.journal as j\n"
T = "import tenxgraph.integrations.openai_agents.tools as t\n"
#: Each mutant: what breaks the integration (a conftest of the tested project), what its cells must say, and
#: what they must not (another mutant's reason).
MUTANTS: dict[str, tuple[str, str, str | None]] = {
    # the model's turns are not journaled: a resume asks the model again, whose new calls run again
    "model_not_journaled": (
        J + "async def g(self, *a, **k):\n    return await self.inner.get_response(*a, **k)\n"
        "j.JournaledModel.get_response = g\n",
        "a model turn ran again and asked for it anew",
        "executed 2 times",
    ),
    # the calls run outside the ledger: a finished call of the journaled turn runs again
    "tools_not_through_ledger": (
        T + "async def c(self, name, invoke, ctx, input):\n    return await invoke(ctx, input)\n"
        "t._LedgerCalls.call = c\n",
        "executed 2 times",
        "a model turn ran again",
    ),
    # the call's key is made anew in each run: a resume does not find the record, and the call the runtime
    # reports is not the one the SDK asked for (the harness names it from the SDK's own ToolContext)
    "call_key_unstable": (
        T + "import uuid\nt.call_message_id = lambda item_id, call_id: uuid.uuid4().hex\n",
        "were given the same idempotency key",
        None,
    ),
}


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, conftest: str) -> list[dict[str, Any]]:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makepyfile(test_agent=TEST)
    pytester.makeconftest(conftest)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--crash-matrix", "--crash-backends=sqlite",
                                  "--crash-modes=inprocess", "--crash-report=matrix.json")  # fmt: skip
    return json.loads((pytester.path / "matrix.json").read_text())["cells"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_broken_integration_is_caught_for_its_own_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, mutant: str
) -> None:
    patch, reason, not_said = MUTANTS[mutant]
    cells = run(pytester, monkeypatch, patch)
    caught = [c for c in cells if c["outcome"] == "violation"]
    assert caught, [(c["point"], c["outcome"], c.get("detail")) for c in cells]
    details = [c["detail"] for c in caught]
    assert all(reason in d and (not_said is None or not_said not in d) for d in details), details


def test_the_integration_as_it_is_fails_no_cell(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    cells = run(pytester, monkeypatch, "")
    assert cells and {c["outcome"] for c in cells} <= {"protected", "known_gap", "in_doubt_handled"}, cells


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The command docs/openai-agents.md gives for its table, as it gives it: the example on SQLite, seed 1."""
    report = tmp_path_factory.mktemp("openai-agents") / "agents-matrix.json"
    command = [sys.executable, "-m", "pytest", "examples/openai_agents_support", "-p", "no:cacheprovider", "-p",
               "no:xdist", "--crash-matrix", "--runxfail", "--crash-backends=sqlite", "--crash-seed=1",
               f"--crash-report={report}"]  # fmt: skip
    env = {**os.environ, "PYTEST_ADDOPTS": "-p no:langsmith_plugin"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return {"report": report, "cells": json.loads(report.read_text())["cells"], "exit": done.returncode}


def test_the_examples_matrix_gives_the_table_docs_openai_agents_shows(example: dict[str, Any]) -> None:
    assert check_agents(example["report"]) == []
    assert example["exit"] != 0  # (--runxfail: the bare agent's violations fail the run, as the before should)
    bare = [c for c in example["cells"] if "::test_bare_agent[" in c["test"] and c["outcome"] == "violation"]
    assert bare and all("a model turn ran again and asked for it anew" in c["detail"] for c in bare)
