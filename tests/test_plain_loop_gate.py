"""The crash matrix on a plain agent loop (``framework="loop"``), run the way users run it: the command
docs/plain-loop.md gives for its before/after table (checked here), and broken loops (pytester), each caught for
its own reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openai")

from tests.doc_figures import check_loop

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]

TEST = """
from functools import partial
import pytest
from examples.plain_loop.agent import make_tools, support_loop
from examples.plain_loop.conversations import Conversations
from examples.plain_loop.provider import FINAL, scripted_client

@pytest.mark.crash_matrix(framework="loop", points="tool.after_return,tool.after_record")
def test_loop(crash_run, effects, tmp_path):
    loop = partial(support_loop, client=scripted_client, tools=make_tools(effects), ledger=crash_run.checkpointer,
                   conversations=Conversations(tmp_path / "c.db"))
    assert crash_run.invoke(loop, {"prompt": "refund A-1042"}).final_text == FINAL
"""

#: What the harness says when results in the conversation are not those of the bodies it saw run.
UNSEEN = "was answered with a result although its body never ran"
#: Each mutant: what breaks the loop (a conftest of the tested project), what its cells must say and must not.
MUTANTS: dict[str, tuple[str, str, str | None]] = {
    # the assistant message is stored only once its calls answered: a retried job asks the model again, and
    # the new message's calls (new ids) run again
    "message_stored_late": (
        """
from examples.plain_loop.conversations import Conversations
_append, held = Conversations.append, {}
def append(self, thread_id, messages):
    if messages and messages[-1].get("tool_calls"):
        held[thread_id] = messages
        return
    _append(self, thread_id, held.pop(thread_id, []) + messages)
Conversations.append = append
""",
        "refund_order was called for 2 distinct calls, 1 in the clean run: a model turn ran again",
        UNSEEN,  # (the conversation holds the results of the calls that ran: the second message's)
    ),
    # the calls are keyed by an id made anew each run, not the one stored with the message: a resume finds no
    # record, and the finished refund runs again
    "key_made_anew": (
        """
import uuid
import examples.plain_loop.agent as a
_run = a.run_calls
async def run_calls(assistant, *args):
    return await _run({**assistant, "id": uuid.uuid4().hex}, *args)
a.run_calls = run_calls
""",
        UNSEEN,  # the witness saw the bodies under the key the ledger was given, not the stored message's
        None,
    ),
}


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, conftest: str) -> dict:  # type: ignore[type-arg]
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makepyfile(test_loop=TEST)
    if conftest:
        pytester.makeconftest(conftest)
    pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--crash-matrix", "--crash-backends=sqlite", "--crash-report=matrix.json"
    )
    return json.loads((pytester.path / "matrix.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The command docs/plain-loop.md gives for its table, as it gives it: the example on SQLite, seed 1."""
    report = tmp_path_factory.mktemp("plain-loop") / "loop-matrix.json"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "examples/plain_loop",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:xdist",
        "--crash-matrix",
        "--runxfail",
        "--crash-backends=sqlite",
        "--crash-seed=1",
        f"--crash-report={report}",
    ]
    env = {**os.environ, "PYTEST_ADDOPTS": "-p no:langsmith_plugin"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return {"report": report, "cells": json.loads(report.read_text())["cells"], "exit": done.returncode,
            "out": done.stdout}  # fmt: skip


def test_the_examples_matrix_gives_the_table_docs_plain_loop_shows(example: dict[str, Any]) -> None:
    assert check_loop(example["report"]) == []
    assert example["exit"] != 0  # (--runxfail: the bare loop's violations fail the run, as the before should)


def test_the_loop_through_the_ledger_holds_and_the_bare_one_is_caught_for_its_own_reason(
    example: dict[str, Any],
) -> None:
    after = [c for c in example["cells"] if "::test_support_loop[" in c["test"]]
    assert {c["mode"] for c in after} == {"inprocess", "sigkill"}
    assert {c["outcome"] for c in after} <= {"protected", "exactly_once", "known_gap", "in_doubt_handled"}, after
    assert {c["outcome"] for c in after} >= {"protected", "in_doubt_handled"}
    bare = [c for c in example["cells"] if "::test_bare_support_loop[" in c["test"]]
    assert bare and all(c["outcome"] == "violation" for c in bare)
    for c in bare:  # the refund its own code made again, outside the ledger, and the fix
        assert "effect 'refund' was applied 2 times by node 'loop' outside any tool" in c["detail"], c["detail"]
        assert "run the loop's calls through tenxgraph.ledger.invoke_tool_calls" in c["detail"]
        assert "body never ran" not in c["detail"]  # (no call of a function the harness cannot see is judged)
        assert c["effects_applied"]["refund"] == 2


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_broken_loop_is_caught_for_its_own_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, mutant: str
) -> None:
    patch, reason, not_said = MUTANTS[mutant]
    cells = run(pytester, monkeypatch, patch)["cells"]
    caught = [c for c in cells if c["outcome"] == "violation"]
    assert caught, [(c["point"], c["mode"], c["outcome"], c.get("detail")) for c in cells]
    details = [c["detail"] for c in caught]
    assert all(reason in d and (not_said is None or not_said not in d) for d in details), details


def test_the_harness_finds_the_tools_a_loop_can_reach_on_its_own() -> None:
    from functools import partial

    from pytest_replaysafe.run.loop_app import reachable_tools
    from tenxgraph import tool

    @tool(effect="external")
    def refund(order_id: str) -> str:
        """Refund."""
        return order_id

    @tool(effect="read")
    def lookup(order_id: str) -> str:
        """Look up."""
        return order_id

    async def loop(thread_id: str, *, tools: list[object]) -> list[object]:
        return []

    def closing(tools: list[object]) -> object:
        async def inner(thread_id: str) -> list[object]:
            return [tools]

        return inner

    class Agent:
        def __init__(self) -> None:
            self.tools = {"refund": refund, "lookup": lookup}

        async def run(self, thread_id: str) -> list[object]:
            return []

    for app in (partial(loop, tools=[refund, lookup]), closing([refund, lookup]), Agent().run):
        assert {t.name for t in reachable_tools(app)} == {"refund", "lookup"}
    assert list(reachable_tools(partial(loop, tools=[]))) == []


def test_a_loop_message_without_its_id_is_a_usage_error() -> None:
    from pytest_replaysafe.run.loop_app import to_message

    call = {"id": "call_1", "type": "function", "function": {"name": "refund", "arguments": "{}"}}
    with pytest.raises(pytest.UsageError, match="has no 'id': keep the id its calls were keyed by"):
        to_message({"role": "assistant", "content": None, "tool_calls": [call]}, 3)
    message = to_message({"role": "assistant", "id": "chatcmpl-1", "tool_calls": [call]}, 3)
    assert message.message_id == "chatcmpl-1" and message.tool_calls[0].id == "call_1"
    result = to_message({"role": "tool", "tool_call_id": "call_1", "content": "ok", "is_error": True}, 4)
    assert result.tool_results[0].is_error and result.tool_results[0].call_id == "call_1"
