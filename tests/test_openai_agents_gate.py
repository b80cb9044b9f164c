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

from examples.openai_agents_support.agent import FINAL, OFFLINE, build_agent, run_support, run_support_streamed
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


def test_a_streamed_run_is_journaled_and_resumed_streamed_or_not(tmp_path: Path) -> None:
    """Runner.run_streamed through stream_replay_safe: the same journal as Runner.run (a streamed run resumes
    unstreamed and back), every event of a live turn passed through, a replayed turn completed from its record."""
    from tenxgraph.integrations.openai_agents import replay_safe, stream_replay_safe

    effects = Effects(tmp_path / "effects.db")
    ledger = lambda: SqliteCheckpointer(tmp_path / "ledger.db")  # noqa: E731 - another process's view each time
    first = asyncio.run(run_support_streamed("run-s", "refund A-1042", agent=build_agent(effects), ledger=ledger()))
    again = asyncio.run(run_support("run-s", "refund A-1042", agent=build_agent(effects), ledger=ledger()))
    assert first == again and first[-1].text == FINAL and effects.count("refund") == 1 == effects.count("email")

    async def kinds(run_id: str) -> list[str]:
        durable = replay_safe(build_agent(effects), ledger=ledger(), run_id=run_id)
        async with stream_replay_safe(durable, "refund A-1042", run_config=OFFLINE) as result:
            return [e.data.type async for e in result.stream_events() if e.type == "raw_response_event"]

    live, replayed = asyncio.run(kinds("run-t")), asyncio.run(kinds("run-t"))
    assert live.count("response.output_item.done") == 3 and live.count("response.completed") == 2
    assert replayed == ["response.completed", "response.completed"] and effects.count("refund") == 2


def test_a_run_resumed_with_another_input_is_refused(tmp_path: Path) -> None:
    effects, ledger = Effects(tmp_path / "effects.db"), InMemoryCheckpointer()
    asyncio.run(run_support("run-2", "refund A-1042", agent=build_agent(effects), ledger=ledger))
    with pytest.raises(ConfigError, match="started with another input than this one"):
        asyncio.run(run_support("run-2", "refund B-7", agent=build_agent(effects), ledger=ledger))
    assert effects.count("refund") == 1


def test_bad_declarations_and_models_are_refused_naming_the_fix(tmp_path: Path) -> None:
    from agents import Agent

    from tenxgraph.integrations.openai_agents import declare, replay_safe

    agent = build_agent(Effects(tmp_path / "effects.db"))
    ledger = InMemoryCheckpointer()
    with pytest.raises(ConfigError, match=r"\['refund'\] are not function tools of agent 'support'"):
        replay_safe(agent, ledger=ledger, run_id="r", effects={"refund": "external"})
    with pytest.raises(ConfigError, match="function tool 'refund_order' is declared twice"):
        replay_safe(agent, ledger=ledger, run_id="r", effects={"refund_order": "idempotent"})
    with pytest.raises(ValueError, match="is invalid; use one of"):
        declare(agent.tools[0], on_in_doubt="maybe")
    with pytest.raises(ValueError, match="on_in_doubt='reconcile' needs reconcile"):
        declare(agent.tools[0], on_in_doubt="reconcile")
    with pytest.raises(ConfigError, match=re.escape("names its model by 'gpt-4.1', not an agents.Model: pass")):
        replay_safe(Agent(name="a", model="gpt-4.1"), ledger=ledger, run_id="r")
    with pytest.raises(ConfigError, match=r"handoff 'b' is neither an agents\.Agent nor an agents\.Handoff"):
        replay_safe(agent.clone(handoffs=["b"]), ledger=ledger, run_id="r")  # type: ignore[list-item]


#: One resumer of an approved pause, in a process of its own: the run's state (saved where the run paused)
#: loaded, the refund approved, the run resumed in turn; it prints what the model was told of each call.
APPROVER = """
import asyncio, json, sys
from agents.run_state import RunState
from examples.openai_agents_support.agent import OFFLINE, build_agent
from pytest_replaysafe.run.effects import Effects
from tenxgraph.integrations.openai_agents import replay_safe, run_replay_safe, to_messages
from tenxgraph.storage.checkpointer import SqliteCheckpointer

async def main(folder):
    agent = build_agent(Effects(folder + "/effects.db"), approval=True)
    durable = replay_safe(agent, ledger=SqliteCheckpointer(folder + "/ledger.db"), run_id="pause-1")
    state = await RunState.from_string(durable, open(folder + "/state.json").read())
    for interruption in state.get_interruptions():
        state.approve(interruption)
    result = await run_replay_safe(durable, state, run_config=OFFLINE)
    print(json.dumps({r.call_id: [r.output, r.is_error] for m in to_messages(result) for r in m.tool_results}))

asyncio.run(main(sys.argv[1]))
"""


def test_k_processes_approving_one_pause_refund_once_and_each_is_told_what_stands(tmp_path: Path) -> None:
    """The run pauses for the refund's approval (``needs_approval``); its ``RunState`` is saved; 4 processes load
    it, approve and resume at once (``run_replay_safe``): the refund happens once, and every resumer's model is
    told the same outcome of each call (the first ran it, the others replayed its record)."""
    from examples.openai_agents_support.agent import OFFLINE
    from tenxgraph.integrations.openai_agents import replay_safe, run_replay_safe

    agent = build_agent(Effects(tmp_path / "effects.db"), approval=True)
    durable = replay_safe(agent, ledger=SqliteCheckpointer(tmp_path / "ledger.db"), run_id="pause-1")
    paused = asyncio.run(run_replay_safe(durable, "refund A-1042", run_config=OFFLINE))
    assert [i.name for i in paused.interruptions] == ["refund_order"]
    (tmp_path / "state.json").write_text(paused.to_state().to_string())
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs = [subprocess.Popen([sys.executable, "-c", APPROVER, str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT) for _ in range(4)]  # fmt: skip
    outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    told = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert all(t == told[0] for t in told), told  # one outcome, whoever resumed
    assert len(told[0]) == 2 and not any(is_error for _, is_error in told[0].values()), told[0]
    effects = Effects(tmp_path / "effects.db")
    assert effects.count("refund") == 1 and effects.count("email") == 1


def test_an_answer_to_a_pause_stands_and_a_different_one_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """One resumer rejects the paused refund; a second, in another process (its own copy of the agent and the
    saved state), approves it: refused (``InterruptDecidedError``, the recorded rejection named), no refund. The
    rejection sent again is answered as the run stands (its record replayed), and the streamed entry refuses the
    approval too."""
    from agents.run_state import RunState

    from tenxgraph.integrations.openai_agents import replay_safe, run_replay_safe, stream_replay_safe
    from tenxgraph.integrations.openai_agents.decisions import decision_key
    from tenxgraph.utils.errors import InterruptDecidedError

    effects = Effects(tmp_path / "effects.db")
    agent, ledger = build_agent(effects, approval=True), SqliteCheckpointer(tmp_path / "ledger.db")
    paused = asyncio.run(run_replay_safe(replay_safe(agent, ledger=ledger, run_id="p"), "refund", run_config=OFFLINE))
    saved = paused.to_state().to_string()

    async def resume(approve: bool, streamed: bool = False) -> Any:
        durable = replay_safe(agent, ledger=ledger, run_id="p")
        state = await RunState.from_string(durable, saved)
        for item in state.get_interruptions():
            state.approve(item) if approve else state.reject(item)
        if streamed:
            async with stream_replay_safe(durable, state, run_config=OFFLINE) as result:
                return result.final_output
        return (await run_replay_safe(durable, state, run_config=OFFLINE)).final_output

    first = asyncio.run(resume(approve=False))
    (call_id,) = [i.raw_item.call_id for i in paused.interruptions]  # type: ignore[union-attr]
    recorded = ledger.get_tool_results("p", [decision_key(call_id)])  # (the run's thread: its run id)
    assert recorded[decision_key(call_id)]["value"] is False
    with pytest.raises(InterruptDecidedError, match=rf"interrupt '{call_id}' was already decided \(False\)"):
        asyncio.run(resume(approve=True))
    with pytest.raises(InterruptDecidedError, match="a second, different decision \\(True\\) is refused"):
        asyncio.run(resume(approve=True, streamed=True))
    assert effects.count("refund") == 0
    assert asyncio.run(resume(approve=False)) == first and effects.count("refund") == 0


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
    # resumers of one run are not taken in turn (Runner.run without the run's lock): each runs the calls the
    # others have not recorded yet
    "no_run_lock": (
        "import tenxgraph.integrations.openai_agents.runs as r, examples.openai_agents_support.agent as a\n"
        "from agents import Runner\n"
        "async def run(agent, input, *, lock_wait=0, **kw):\n    return await Runner.run(agent, input, **kw)\n"
        "r.run_replay_safe = a.run_replay_safe = run\n",
        'send_email(\'{"to": "ada@example.com", "subject": "Your refund"}\') executed ',
        "a model turn ran again",
    ),
    # the tool's declaration is dropped: the refund, declared external, is handled as a call with no effect
    # class (the harness reads the declaration on the tool itself)
    "declaration_dropped": (
        T + "t.declaration_of = lambda tool: (None, None, None)\n",
        "refund_order(",
        None,
    ),
    # the call's key is made anew in each run: a resume does not find the record, and the call the runtime
    # reports is not the one the SDK asked for (the harness names it from the SDK's own ToolContext)
    "call_key_unstable": (
        T + "import uuid\nt.call_message_id = lambda item_id, call_id: uuid.uuid4().hex\n",
        "were given the same idempotency key",
        None,
    ),
}


#: The same test on the streamed run (``stream_replay_safe``), and what breaks the streamed path.
STREAMED = TEST.replace("run_support", "run_support_streamed")
STREAM_MUTANTS: dict[str, tuple[str, str, str | None]] = {
    # the streamed turns are not journaled: a resume streams the model again, whose new calls run again
    "stream_not_journaled": (
        J + "async def s(self, *a, **k):\n    async for e in self.inner.stream_response(*a, **k):\n        yield e\n"
        "j.JournaledModel.stream_response = s\n",
        "a model turn ran again and asked for it anew",
        "executed 2 times",
    ),
    # the streamed run is not taken in turn (Runner.run_streamed without the run's lock)
    "stream_without_run_lock": (
        "import contextlib, examples.openai_agents_support.agent as a\nfrom agents import Runner\n"
        "@contextlib.asynccontextmanager\nasync def s(agent, input, **kw):\n"
        "    result = Runner.run_streamed(agent, input, **kw)\n    yield result\n"
        "a.stream_replay_safe = s\n",
        'send_email(\'{"to": "ada@example.com", "subject": "Your refund"}\') executed ',
        "a model turn ran again",
    ),
}


#: The refund waits for a person (``needs_approval``), answered by the ``approvals`` fixture from the run's
#: ``RunState``; and what breaks the pause.
APPROVED = """
from functools import partial
import pytest
from examples.openai_agents_support.agent import FINAL, build_agent, run_approved

@pytest.mark.crash_matrix(framework="openai_agents",
                          points="approval.after_pause,approval.after_decision,tool.after_record")
def test_agent(crash_run, effects, approvals):
    run = partial(run_approved, agent=build_agent(effects, approval=True), ledger=crash_run.checkpointer)
    assert crash_run.invoke(run, {"prompt": "refund A-1042"}).final_text == FINAL
"""
APPROVAL_MUTANTS: dict[str, tuple[str, str, str | None]] = {
    # the RunState's answers are not recorded in the ledger: the refund runs on an answer nobody can read back
    "answers_not_recorded": (
        "import tenxgraph.integrations.openai_agents.runs as r\n"
        "async def settle(*a, **k):\n    return None\nr.settle = settle\n",
        "ran although its approval was never recorded",
        "executed",
    ),
    # the run's copy of the agent drops the tool's needs_approval: the refund runs and nobody was asked (the
    # harness read needs_approval on the tool itself)
    "approval_dropped": (
        "import dataclasses, examples.openai_agents_support.agent as a\nreal = a.replay_safe\n"
        "def replay_safe(agent, **kw):\n    copy = real(agent, **kw)\n"
        "    copy.tools = [dataclasses.replace(t, needs_approval=False) for t in copy.tools]\n"
        "    return copy\na.replay_safe = replay_safe\n",
        "ran although no person was asked",
        "executed",
    ),
    # a different answer after the recorded one is not refused (double-resume: a second person's "no" after the
    # recorded "yes"): the run goes on with an answer that does not stand
    "other_answer_taken": (
        "import tenxgraph.integrations.openai_agents.decisions as d\n"
        "from tenxgraph.utils.errors import InterruptDecidedError\nreal = d.record_first_answers\n"
        "async def first(*a, **k):\n    try:\n        return await real(*a, **k)\n"
        "    except InterruptDecidedError:\n        return {}\nd.record_first_answers = first\n",
        "otherwise than the recorded decisions was accepted",
        "executed",
    ),
}


def run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, conftest: str, mode: str, test: str = TEST
) -> list[dict[str, Any]]:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makepyfile(test_agent=test)
    pytester.makeconftest(conftest)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--crash-matrix", "--crash-backends=sqlite",
                                  f"--crash-modes={mode}", "--crash-report=matrix.json")  # fmt: skip
    return json.loads((pytester.path / "matrix.json").read_text())["cells"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_broken_integration_is_caught_for_its_own_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, mutant: str
) -> None:
    patch, reason, not_said = MUTANTS[mutant]
    cells = run(pytester, monkeypatch, patch, "resumers" if mutant == "no_run_lock" else "inprocess")
    caught = [c for c in cells if c["outcome"] == "violation"]
    assert caught, [(c["point"], c["outcome"], c.get("detail")) for c in cells]
    details = [c["detail"] for c in caught]
    assert all(reason in d and (not_said is None or not_said not in d) for d in details), details


@pytest.mark.parametrize("mutant", sorted(STREAM_MUTANTS))
def test_a_broken_streamed_path_is_caught_for_its_own_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, mutant: str
) -> None:
    patch, reason, not_said = STREAM_MUTANTS[mutant]
    mode = "resumers" if mutant == "stream_without_run_lock" else "inprocess"
    cells = run(pytester, monkeypatch, patch, mode, STREAMED)
    caught = [c for c in cells if c["outcome"] == "violation"]
    assert caught, [(c["point"], c["outcome"], c.get("detail")) for c in cells]
    details = [c["detail"] for c in caught]
    assert all(reason in d and (not_said is None or not_said not in d) for d in details), details


@pytest.mark.parametrize("mutant", sorted(APPROVAL_MUTANTS))
def test_a_broken_pause_is_caught_for_its_own_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, mutant: str
) -> None:
    patch, reason, not_said = APPROVAL_MUTANTS[mutant]
    cells = run(pytester, monkeypatch, patch, "double-resume" if mutant == "other_answer_taken" else "inprocess",
                APPROVED)  # fmt: skip
    caught = [c for c in cells if c["outcome"] == "violation"]
    assert caught, [(c["point"], c["outcome"], c.get("detail")) for c in cells]
    details = [c["detail"] for c in caught]
    assert all(reason in d and (not_said is None or not_said not in d) for d in details), details


#: Each test as it is, in the modes its cells run in.
AS_IT_IS = [*((t, m) for t in ("run", "streamed", "approved") for m in ("inprocess", "resumers")),
            ("approved", "double-resume")]  # fmt: skip


@pytest.mark.parametrize(("test", "mode"), AS_IT_IS)
def test_the_integration_as_it_is_fails_no_cell(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, mode: str, test: str
) -> None:
    cells = run(pytester, monkeypatch, "", mode, {"run": TEST, "streamed": STREAMED, "approved": APPROVED}[test])
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
