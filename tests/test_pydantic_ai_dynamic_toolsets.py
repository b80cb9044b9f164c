"""Pydantic AI's dynamic toolsets (a function of the run's context that returns the toolset of each run step,
given to the agent's constructor with an id: ``Agent(..., toolsets=[DynamicToolset(func, id=...)])``) under
LedgerDurability: their tools' calls go through the ledger like a function toolset's, so a crash and a resume run
a finished call once, and the toolset function itself (no effect outside the process) runs again on the resume.
Effects counted outside the run, in a list the tool appends to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai.durable_exec")

from pydantic_ai import Agent, FunctionToolset, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import DynamicToolset

from tenxgraph.core import crashpoints
from tenxgraph.integrations.pydantic_ai import LedgerDurability, current_idempotency_key
from tenxgraph.storage.checkpointer import SqliteCheckpointer

PROMPT = "refund A-1 and B-2"


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Two refunds at once, then what they returned."""
    returns = sorted(str(p.content) for m in messages for p in m.parts if isinstance(p, ToolReturnPart))
    if returns:
        return ModelResponse(parts=[TextPart("; ".join(returns))])
    return ModelResponse(parts=[ToolCallPart("refund", {"order": "A-1"}), ToolCallPart("refund", {"order": "B-2"})])


def build(path: Path, refunds: list[tuple[str, str | None]], built: list[int]) -> Agent[None, Any]:
    """The agent on a new ledger object over *path* (another process's view); its refund tool comes from a dynamic
    toolset (*built* counts how often the toolset function ran), each refund appended to *refunds* with its key."""
    durability = LedgerDurability(SqliteCheckpointer(path), name="dynamic", effects={"refund": "idempotent"})

    def per_step(ctx: RunContext[None]) -> FunctionToolset[None]:
        built.append(ctx.run_step)
        tools: FunctionToolset[None] = FunctionToolset()

        @tools.tool_plain
        def refund(order: str) -> str:
            """Refund *order*."""
            refunds.append((order, current_idempotency_key()))
            return f"refunded {order}"

        return tools

    # (a durable agent's dynamic toolset is given to its constructor, with an id: Pydantic AI refuses one added
    # later, and one without an id)
    toolset = DynamicToolset(per_step, id="refunds")
    agent: Agent[None, Any] = Agent(FunctionModel(model), capabilities=[durability], toolsets=[toolset])
    return agent


@pytest.mark.parametrize("point", ["tool.after_return", "tool.after_record"])
def test_a_dynamic_toolsets_calls_run_once_across_a_crash_and_a_resume(tmp_path: Path, point: str) -> None:
    refunds: list[tuple[str, str | None]] = []
    built: list[int] = []
    with crashpoints.armed(point, hit=2), pytest.raises(crashpoints.CrashInjected):
        build(tmp_path / "ledger.db", refunds, built).run_sync(PROMPT, run_id="r1")
    assert sorted(order for order, _ in refunds) == ["A-1", "B-2"]  # both ran before the crash
    result = build(tmp_path / "ledger.db", refunds, built).run_sync(PROMPT, run_id="r1")
    assert result.output == "refunded A-1; refunded B-2"
    ran = sorted(order for order, _ in refunds)
    # after their records, neither runs again; a call the crash cut before its record may, once (with its key)
    twice = {order for order in ran if ran.count(order) > 1}
    assert set(ran) == {"A-1", "B-2"} and all(ran.count(order) <= 2 for order in ran), ran
    if point == "tool.after_record":
        assert not twice, ran
    assert all(key for _, key in refunds)
    keys = {order: {key for o, key in refunds if o == order} for order, _ in refunds}
    assert all(len(k) == 1 for k in keys.values()), keys  # (a call run again: the same idempotency key)
    assert built  # (the toolset function ran in each run: it has no effect outside the process)


def test_a_finished_run_with_a_dynamic_toolset_is_answered_from_its_records(tmp_path: Path) -> None:
    refunds: list[tuple[str, str | None]] = []
    built: list[int] = []
    first = build(tmp_path / "ledger.db", refunds, built).run_sync(PROMPT, run_id="r2")
    again = build(tmp_path / "ledger.db", refunds, built).run_sync(PROMPT, run_id="r2")
    assert first.output == again.output == "refunded A-1; refunded B-2"
    assert sorted(order for order, _ in refunds) == ["A-1", "B-2"]  # once each, though run twice
