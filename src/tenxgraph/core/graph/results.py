"""What a run gives back: ``RunResult`` from ``invoke``, ``StreamEvent`` from ``stream``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tenxgraph.core.tools.interrupts import Interrupt
from tenxgraph.state.messages import Message
from tenxgraph.state.state import AgentState

S = TypeVar("S", bound=AgentState)


@dataclass(slots=True)
class RunResult(Generic[S]):
    """What ``invoke`` returns: the thread's state after the run, and the thread id (generated if none given);
    a run that paused for a person has status ``interrupted`` and lists what it waits for in ``interrupts``."""

    thread_id: str
    state: S
    version: int
    thread_id_generated: bool = False
    #: Status ``interrupted``: what the thread waits for (approvals, ``interrupt()`` questions), each answered
    #: with ``app.invoke(Resume({interrupt.id: decision}), config)``.
    interrupts: list[Interrupt] = field(default_factory=list)

    @property
    def messages(self) -> list[Message]:
        return self.state.messages

    @property
    def status(self) -> str:
        return self.state.meta.status

    @property
    def final_text(self) -> str:
        """The text of the last assistant message ("" if there is none)."""
        message = self.state.last_assistant
        return message.text if message is not None else ""


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of ``stream``/``astream``: a node finished (``node``), or the run ended (``node == END``)."""

    node: str
    step: int
    messages: list[Message] = field(default_factory=list)
    update: dict[str, Any] = field(default_factory=dict)
    result: RunResult[Any] | None = None

    @property
    def replayed(self) -> bool:
        """True if a tool result of this event was replayed from the ledger instead of executed (for UIs)."""
        return any(m.metadata.get("replayed") for m in self.messages)
