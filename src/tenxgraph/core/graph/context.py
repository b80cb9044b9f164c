"""The context of the run a node executes in, available to nodes through :func:`current_run`."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

from tenxgraph.core.graph.config import RunConfig
from tenxgraph.storage.checkpointer.base import BaseCheckpointer


@dataclass(frozen=True, slots=True)
class RunContext:
    config: RunConfig
    checkpointer: BaseCheckpointer
    node: str
    #: This node is the one a crashed or failed run left unfinished, run again by a resume.
    resumed: bool = False

    @property
    def thread_id(self) -> str:
        return self.config.thread_id


_current: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar("tenxgraph_run", default=None)


def current_run() -> RunContext | None:
    """The run context of the node being executed, or None outside a run."""
    return _current.get()


def set_current_run(ctx: RunContext | None) -> contextvars.Token[RunContext | None]:
    return _current.set(ctx)


def reset_current_run(token: contextvars.Token[RunContext | None]) -> None:
    _current.reset(token)
