"""A replay-safe run, taken in turn: :func:`run_replay_safe` runs an agent made by
:func:`~.tools.replay_safe` under its run's lock in the ledger's store (the store's run lock), so that k processes
that resume one run at once (a retried job delivered twice, k people approving one pause from a ``RunState``)
take it in turn: the first runs what is left, each later one replays what the first recorded, from the journal
and the ledger, and ends with the same conversation."""

from __future__ import annotations

from typing import Any

from agents import Agent, Runner
from agents.result import RunResult

from tenxgraph.integrations.openai_agents.journal import JournaledModel
from tenxgraph.ledger import waiting_lock
from tenxgraph.utils.errors import ConfigError

__all__ = ["LOCK_WAIT_S", "run_replay_safe"]

#: How long a resumer waits for the run another process holds, by default (then ``ThreadBusyError``).
LOCK_WAIT_S = 120.0


async def run_replay_safe(agent: Agent[Any], input: Any, *, lock_wait: float = LOCK_WAIT_S, **run: Any) -> RunResult:
    """``Runner.run(agent, input, **run)`` under the run's lock (*agent*: made by ``replay_safe``; *input*: the
    run's input, or the ``RunState`` it resumes from); waits up to *lock_wait* seconds for another holder."""
    model = agent.model
    if not isinstance(model, JournaledModel):
        raise ConfigError(
            f"run_replay_safe: agent {agent.name!r} was not made by replay_safe(agent, ledger=..., run_id=...): "
            "make the run's copy first, then run it"
        )
    async with waiting_lock(model.ledger, model.thread, model.thread, lock_wait, "one OpenAI Agents SDK run"):
        return await Runner.run(agent, input, **run)
