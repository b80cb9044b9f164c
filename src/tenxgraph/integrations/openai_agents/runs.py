"""A replay-safe run, taken in turn: :func:`run_replay_safe` runs an agent made by
:func:`~.tools.replay_safe` under its run's lock in the ledger's store (the store's run lock), so that k processes
that resume one run at once (a retried job delivered twice, k people approving one pause from a ``RunState``)
take it in turn: the first runs what is left, each later one replays what the first recorded, from the journal
and the ledger, and ends with the same conversation. :func:`stream_replay_safe` is the same for
``Runner.run_streamed``: the lock is held while the caller reads the run's events. Resumed from a ``RunState``,
both record its answers first, once (:mod:`.decisions`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from agents import Agent, Runner
from agents.result import RunResult, RunResultStreaming
from agents.run_state import RunState

from tenxgraph.integrations.openai_agents.decisions import settle
from tenxgraph.integrations.openai_agents.journal import JournaledModel
from tenxgraph.integrations.openai_agents.sessions import RewoundSession
from tenxgraph.ledger import waiting_lock
from tenxgraph.utils.errors import ConfigError

__all__ = ["LOCK_WAIT_S", "run_replay_safe", "stream_replay_safe"]

#: How long a resumer waits for the run another process holds, by default (then ``ThreadBusyError``).
LOCK_WAIT_S = 120.0


async def run_replay_safe(agent: Agent[Any], input: Any, *, lock_wait: float = LOCK_WAIT_S, **run: Any) -> RunResult:
    """``Runner.run(agent, input, **run)`` under the run's lock (*agent*: made by ``replay_safe``; *input*: the
    run's input, or the ``RunState`` it resumes from); waits up to *lock_wait* seconds for another holder. A
    ``RunState``'s answers to its interruptions are recorded first, once (:mod:`.decisions`): an answer other than
    the recorded one raises ``InterruptDecidedError`` and nothing runs."""
    model = _journaled(agent, "run_replay_safe")
    async with waiting_lock(model.ledger, model.thread, model.thread, lock_wait, "one OpenAI Agents SDK run"):
        if isinstance(input, RunState):
            await settle(input, model.ledger, model.thread)
        return await Runner.run(agent, input, **_rewound(model, input, run))


@asynccontextmanager
async def stream_replay_safe(
    agent: Agent[Any], input: Any, *, lock_wait: float = LOCK_WAIT_S, **run: Any
) -> AsyncIterator[RunResultStreaming]:
    """``Runner.run_streamed(agent, input, **run)`` under the run's lock, as a context: read the result's
    ``stream_events()`` inside it. Leaving it runs the rest of the run to its end (events not read are dropped),
    or, when the block raised, cancels it; the lock is released after either.

        async with stream_replay_safe(durable, "refund order 1042") as result:
            async for event in result.stream_events():
                ...
    """
    model = _journaled(agent, "stream_replay_safe")
    async with waiting_lock(model.ledger, model.thread, model.thread, lock_wait, "one OpenAI Agents SDK run"):
        if isinstance(input, RunState):
            await settle(input, model.ledger, model.thread)
        result = Runner.run_streamed(agent, input, **_rewound(model, input, run))
        try:
            yield result
        except BaseException:
            result.cancel()
            async for _ in result.stream_events():  # (its tasks stopped before the lock goes)
                pass
            raise
        async for _ in result.stream_events():
            pass


def _rewound(model: JournaledModel, input: Any, run: dict[str, Any]) -> dict[str, Any]:
    """*run*'s arguments, its ``session`` (if any) rewound to where the run began (:mod:`.sessions`); a run
    resumed from a ``RunState`` goes on from the state, on its session as it is."""
    session = run.get("session")
    if session is None or isinstance(input, RunState) or isinstance(session, RewoundSession):
        return run
    return {**run, "session": RewoundSession(session, model.ledger, model.thread, model.run_id)}


def _journaled(agent: Agent[Any], entry: str) -> JournaledModel:
    model = agent.model
    if not isinstance(model, JournaledModel):
        raise ConfigError(
            f"{entry}: agent {agent.name!r} was not made by replay_safe(agent, ledger=..., run_id=...): "
            "make the run's copy first, then run it"
        )
    return model
