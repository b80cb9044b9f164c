"""A person's answers to a run's interruptions, consumed once: the SDK pauses a run on a tool that needs approval
(``needs_approval``); the run's ``RunState`` is approved or rejected call by call (``state.approve(item)``,
``state.reject(item)``) and the run resumed from it. Alone, every such resume takes its own answers: one process
that approves after another rejected refunds anyway.

:func:`settle` runs where :func:`~.runs.run_replay_safe` resumes from a ``RunState``, under the run's lock, before
the run goes on: each answered call's answer is recorded in the run's thread (``decision:{call_id}``, first write
wins) and an answer other than the recorded one is refused with
:class:`~tenxgraph.utils.errors.InterruptDecidedError` naming the one that stands, before anything runs. The same
answer again goes on, and replays what the first resume recorded. Calls not answered are left as they are (the
run pauses on them again)."""

from __future__ import annotations

from typing import Any

from agents.run_state import RunState

from tenxgraph.ledger import LedgerStore, probe, record_first_answers
from tenxgraph.state.messages import JSON
from tenxgraph.utils.errors import ConfigError

__all__ = ["decision_key", "settle"]


def decision_key(call_id: str) -> str:
    """Where the answer to the interrupted call *call_id* is recorded, in its run's thread."""
    return f"decision:{call_id}"


def answers(state: RunState[Any, Any]) -> dict[str, JSON]:
    """Each interrupted call's answer in *state*, by ``call_id``: ``True`` approved, ``False`` rejected (calls not
    answered are left out). The answers live on the state's run context (the SDK's ``is_tool_approved``)."""
    context = getattr(state, "_context", None)
    if context is None or not hasattr(context, "is_tool_approved"):
        raise ConfigError(
            "run_replay_safe: this RunState carries no run context to read its answers from (openai-agents>=0.24 "
            "keeps them there): load it with RunState.from_string(agent, saved) and answer it there"
        )
    found: dict[str, JSON] = {}
    for item in state.get_interruptions():
        call_id = getattr(item.raw_item, "call_id", None)
        if not isinstance(call_id, str):
            raise ConfigError(
                f"run_replay_safe: the interruption of tool {item.tool_name!r} is not a function call (no "
                "call_id): only function tools' approvals go through the ledger"
            )
        status = context.is_tool_approved(item.tool_name or "", call_id)
        if status is not None:
            found[call_id] = bool(status)
    return found


async def settle(state: RunState[Any, Any], ledger: LedgerStore, thread: str) -> None:
    """Record *state*'s answers in *thread* (first write wins); raise ``InterruptDecidedError`` when one differs
    from the answer recorded for its call."""
    given = answers(state)
    if not given:
        return
    records: dict[str, tuple[str, dict[str, JSON]]] = {
        call_id: (decision_key(call_id), {"v": 1, "kind": "decision", "call": call_id, "value": value})
        for call_id, value in given.items()
    }
    await record_first_answers(ledger, thread, records)  # (outside the lock: another resumer's may win)
    probe.point("approval.after_decision")  # (the answers are recorded; the run that takes them has not begun)
