"""A person's answer to Pydantic AI's deferred tools, consumed once: :func:`resume_once` / :func:`aresume_once`.

Pydantic AI pauses a run on a tool that needs approval (``requires_approval=True``, or a tool raising
``ApprovalRequired`` / ``CallDeferred``): the run's output is ``DeferredToolRequests``, and a new run given
``deferred_tool_results`` with the run's messages goes on. Alone, every such run runs the approved tool: two
processes that send one approval refund twice, and one that approves after another denied refunds anyway.

Under :class:`~tenxgraph.integrations.pydantic_ai.LedgerDurability` an approved call is keyed in the ledger by the
conversation, the response that asked for it and its ``tool_call_id``, so it runs once whoever sends the approval
(the others replay its record). ``resume_once`` also records each answer first (``decision:{tool_call_id}`` in the
conversation's thread, first write wins, with the ``run_id`` of the run that takes it), then runs the agent: an
answer other than the recorded one is refused with :class:`~tenxgraph.utils.errors.InterruptDecidedError` naming
the one that stands, before anything runs; the same answer again runs the agent under the recorded ``run_id``, so
it replays that run (its model turns and tool calls, recorded) instead of asking the model anew: k processes that
send one approval get one refund, one receipt and the same answer."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from pydantic_ai import DeferredToolResults
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.messages import ModelMessage
from pydantic_ai.run import AgentRunResult
from pydantic_core import to_jsonable_python

from tenxgraph.integrations.pydantic_ai.backend import thread_of
from tenxgraph.integrations.pydantic_ai.durability import LedgerDurability
from tenxgraph.integrations.pydantic_ai.home_loop import HomeLoopLedger
from tenxgraph.ledger import LedgerStore, probe, record_first_answers
from tenxgraph.state.messages import JSON
from tenxgraph.utils.errors import ConfigError
from tenxgraph.utils.sync import run_sync

__all__ = ["aresume_once", "decision_key", "resume_once"]


def decision_key(tool_call_id: str) -> str:
    """Where the answer to the deferred call *tool_call_id* is recorded, in its conversation's thread."""
    return f"decision:{tool_call_id}"


async def aresume_once(
    agent: AbstractAgent[Any, Any],
    deferred_tool_results: DeferredToolResults,
    *,
    message_history: Sequence[ModelMessage],
    **run_kwargs: Any,
) -> AgentRunResult[Any]:
    """Record the answers in *deferred_tool_results* (first write wins), then ``agent.run`` with them and
    *message_history* (and *run_kwargs*: ``run_id``, ``deps`` ...). An answer other than the one recorded for its
    call raises ``InterruptDecidedError`` and nothing runs; the same answer again runs the agent, which replays
    what the first run of it recorded (under that run's ``run_id``)."""
    run_id = await _settle(agent, deferred_tool_results, message_history, run_kwargs.pop("run_id", None))
    return await agent.run(message_history=list(message_history), deferred_tool_results=deferred_tool_results,
                           run_id=run_id, **run_kwargs)  # fmt: skip


def resume_once(
    agent: AbstractAgent[Any, Any],
    deferred_tool_results: DeferredToolResults,
    *,
    message_history: Sequence[ModelMessage],
    **run_kwargs: Any,
) -> AgentRunResult[Any]:
    """:func:`aresume_once` for sync code (``agent.run_sync``)."""
    run_id = run_sync(_settle(agent, deferred_tool_results, message_history, run_kwargs.pop("run_id", None)))
    return agent.run_sync(message_history=list(message_history), deferred_tool_results=deferred_tool_results,
                          run_id=run_id, **run_kwargs)  # fmt: skip


async def _settle(
    agent: AbstractAgent[Any, Any], results: DeferredToolResults, history: Sequence[ModelMessage], run_id: str | None
) -> str:
    """Record the answers (or check them against the recorded ones); the ``run_id`` of the run that takes them."""
    durability = LedgerDurability.from_agent(agent)
    if durability is None:
        raise ConfigError(
            f"resume_once: agent {agent.name!r} has no LedgerDurability capability, so there is no ledger to record "
            "the answers in: build it with Agent(..., capabilities=[LedgerDurability(ledger)])"
        )
    conversation = next((m.conversation_id for m in reversed(history) if m.conversation_id), None)
    if conversation is None:
        raise ConfigError(
            "resume_once: message_history has no conversation_id: pass the paused run's messages "
            "(result.all_messages()), which carry it"
        )
    ledger: LedgerStore = HomeLoopLedger(durability.ledger)  # (from any loop: see home_loop.py)
    thread = thread_of(durability.name, conversation)
    given = {call_id: _canonical(answer) for call_id, answer in results.to_tool_call_results().items()}
    if not given:
        raise ConfigError("resume_once: deferred_tool_results answers no call; give approvals= or calls=")
    run = run_id or str(uuid.uuid4())
    records: dict[str, tuple[str, dict[str, JSON]]] = {
        call_id: (decision_key(call_id), {"v": 1, "kind": "decision", "call": call_id, "value": value, "run_id": run})
        for call_id, value in given.items()
    }
    found = await record_first_answers(ledger, thread, records)
    probe.point("approval.after_decision")  # (the answers are recorded; the run that takes them has not begun)
    taken = [found[key].get("run_id") for key, _ in records.values() if key in found]
    return str(taken[0]) if taken and taken[0] else run  # (answered before: that run goes on, or replays)


def _canonical(answer: object) -> JSON:
    """An answer as the ledger stores it (Pydantic AI's normalised form, as JSON): what two answers compare by."""
    value: JSON = to_jsonable_python(answer, fallback=str)
    return value
