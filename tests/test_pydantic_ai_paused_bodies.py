"""A Pydantic AI tool whose body pauses the run, as Pydantic AI's docs show: ``raise ApprovalRequired`` until
``ctx.tool_call_approved``, or ``raise CallDeferred`` (its result comes from elsewhere). Under LedgerDurability
the pause is no result of the call: it is not recorded, so the approved run runs the body (once, whoever sends
the approval), and a deferred call's answer reaches the model."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai.durable_exec")

from pydantic_ai import Agent, ApprovalRequired, CallDeferred, DeferredToolRequests, DeferredToolResults, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from tenxgraph.integrations.pydantic_ai import LedgerDurability, resume_once
from tenxgraph.storage.checkpointer import SqliteCheckpointer


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Asks for the refund and the shipment together; answers with what they returned."""
    returns = {p.tool_name: p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
    if "refund" in returns and "ship" in returns:
        return ModelResponse(parts=[TextPart(f"{returns['refund']}; {returns['ship']}")])
    return ModelResponse(parts=[ToolCallPart("refund", {"order": "A-1"}), ToolCallPart("ship", {"order": "A-1"})])


def build(path: Path, ran: Counter[str], effect: str | None) -> Agent[None, Any]:
    """The agent on a new ledger object over *path* (another process's view); *ran* counts each body's effects.
    *effect*: the refund's declared effect class (``external`` writes an intent before it runs)."""
    effects = {"refund": effect} if effect else {}
    agent: Agent[None, Any] = Agent(
        FunctionModel(model),
        name="desk",
        output_type=[str, DeferredToolRequests],
        capabilities=[LedgerDurability(SqliteCheckpointer(path), effects=effects)],
    )

    @agent.tool
    def refund(ctx: RunContext[None], order: str) -> str:
        """Refund *order*, once a person approved it."""
        if not ctx.tool_call_approved:
            raise ApprovalRequired()
        ran["refund"] += 1
        return f"refunded {order}"

    @agent.tool_plain
    def ship(order: str) -> str:
        """Ship *order*: the warehouse answers later."""
        ran["ship"] += 1
        raise CallDeferred()

    return agent


@pytest.mark.parametrize("effect", [None, "external"])
def test_an_approved_body_runs_once_and_a_deferred_calls_answer_reaches_the_model(
    tmp_path: Path, effect: str | None
) -> None:
    ran: Counter[str] = Counter()
    ledger = tmp_path / "ledger.db"
    paused = build(ledger, ran, effect).run_sync("refund and ship A-1", run_id="r1")
    assert isinstance(paused.output, DeferredToolRequests)
    assert [c.tool_name for c in paused.output.approvals] == ["refund"]
    assert [c.tool_name for c in paused.output.calls] == ["ship"]
    answers = DeferredToolResults(
        approvals={paused.output.approvals[0].tool_call_id: True},
        calls={paused.output.calls[0].tool_call_id: "shipped T-7"},
    )
    history = paused.all_messages()
    first = resume_once(build(ledger, ran, effect), answers, message_history=history)
    again = resume_once(build(ledger, ran, effect), answers, message_history=history)  # (sent twice)
    assert first.output == again.output == "refunded A-1; shipped T-7"
    assert ran == Counter({"refund": 1, "ship": 1})  # (the deferred body ran once: its answer came from outside)


def test_a_paused_run_run_again_before_its_answer_pauses_again_and_runs_nothing(tmp_path: Path) -> None:
    """The run that paused, run again by a retried job before anyone answered: its bodies pause again (the pause
    was not recorded as their result), and the approval that comes after still runs the refund once."""
    ran: Counter[str] = Counter()
    ledger = tmp_path / "ledger.db"
    first = build(ledger, ran, None).run_sync("refund and ship A-1", run_id="r1")
    retried = build(ledger, ran, None).run_sync("refund and ship A-1", run_id="r1")
    assert isinstance(first.output, DeferredToolRequests) and isinstance(retried.output, DeferredToolRequests)
    assert [c.tool_call_id for c in retried.output.approvals] == [c.tool_call_id for c in first.output.approvals]
    answers = DeferredToolResults(approvals={first.output.approvals[0].tool_call_id: True},
                                  calls={first.output.calls[0].tool_call_id: "shipped"})  # fmt: skip
    done = resume_once(build(ledger, ran, None), answers, message_history=retried.all_messages())
    assert done.output == "refunded A-1; shipped" and ran["refund"] == 1


pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]
#: The same desk under the crash matrix, the ``approvals`` fixture playing the person and the warehouse: the
#: refund is approved, the shipment answered with its tracking number (Pydantic AI's ``calls=``).
MATRIX = """
import pytest
from pydantic_ai import Agent, ApprovalRequired, CallDeferred, DeferredToolRequests, RunContext
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel
from tenxgraph.integrations.pydantic_ai import LedgerDurability, current_idempotency_key

def model(messages, info):
    returns = {p.tool_name: p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
    if {"refund", "ship"} <= set(returns):
        return ModelResponse(parts=[TextPart(f"{returns['refund']}; {returns['ship']}")])
    return ModelResponse(parts=[ToolCallPart("refund", {"order": "A-1"}), ToolCallPart("ship", {"order": "A-1"})])

@pytest.mark.crash_matrix(framework="pydantic_ai", backends="sqlite")
def test_desk(crash_run, effects, approvals):
    durability = LedgerDurability(crash_run.checkpointer, effects={"refund": "idempotent"})
    agent = Agent(FunctionModel(model), name="desk", output_type=[str, DeferredToolRequests],
                  capabilities=[durability])

    @agent.tool
    def refund(ctx: RunContext[None], order: str) -> str:
        if not ctx.tool_call_approved:
            raise ApprovalRequired()
        effects.apply("refund", {"order": order}, current_idempotency_key())
        return "refunded " + order

    @agent.tool_plain
    def ship(order: str) -> str:
        raise CallDeferred()

    approvals.answer(lambda i: "shipped T-7" if i.tool == "ship" else True)
    result = crash_run.invoke(agent, {"user_prompt": "refund and ship A-1"})
    assert result.final_text == "refunded A-1; shipped T-7"
    assert effects.count("refund", thread_id=crash_run.thread_id) == 1
    assert {i.kind for i in approvals.asked(crash_run.thread_id)} == {"approval", "interrupt"}
"""


def test_the_matrix_answers_paused_bodies_and_finds_no_violation(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed at every point (the pause's too) and resumed, and by k processes answering at once: each body that
    paused runs once after its answer, the refund once, and the verdict counts no paused body as a run."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makepyfile(test_desk=MATRIX)
    modes = "--crash-modes=inprocess,sigkill,resumers"
    done = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--crash-matrix", "--crash-backends=sqlite",
                                         modes, "--crash-report=m.json")  # fmt: skip
    cells = json.loads((pytester.path / "m.json").read_text())["cells"]
    outcomes = Counter(c["outcome"] for c in cells)
    assert done.ret == 0 and set(outcomes) <= {"protected", "known_gap", "in_doubt_handled"}, cells
    assert {"approval.after_pause", "approval.after_decision"} <= {c["point"] for c in cells}


def test_a_pause_recorded_as_the_calls_result_is_caught(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mutant: the backend records the body's pause as the call's result (as it did before): the approved run
    replays the pause instead of running the refund, and Pydantic AI refuses the answer's run (its run id already
    ended paused): the cells fail, the clean run's included."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makepyfile(test_desk=MATRIX)
    pytester.makeconftest("import tenxgraph.integrations.pydantic_ai.backend as b\nb.PAUSES = ()\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--crash-matrix", "--crash-backends=sqlite",
                                  "--crash-modes=inprocess", "--crash-points=approval.after_pause",
                                  "--crash-report=m.json")  # fmt: skip
    cells = json.loads((pytester.path / "m.json").read_text())["cells"]
    details = [str(c.get("detail")) for c in cells if c["outcome"] not in ("protected", "known_gap")]
    assert details and all("already appears" in d for d in details), details
