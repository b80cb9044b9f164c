"""What a run gives back: ``RunResult`` from ``invoke``, ``StreamEvent`` from ``stream``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tenxgraph.core.tools.interrupts import Interrupt
from tenxgraph.ledger import ledger_key
from tenxgraph.state.messages import Message
from tenxgraph.state.state import AgentState

S = TypeVar("S", bound=AgentState)


@dataclass(frozen=True, slots=True)
class InDoubt:
    """A call whose effect is not known: its tool, ``tool_call_id``, ledger key, and what the model was told."""

    tool: str | None
    call_id: str
    key: str | None
    told: str

    def to_dict(self) -> dict[str, str | None]:
        return {"tool": self.tool, "call_id": self.call_id, "key": self.key, "told": self.told}


def _turn_start(messages: list[Message]) -> int:
    """Where the last turn starts: the last user message (the whole thread if it has none)."""
    return next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "user"), 0)


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
    def finish_reason(self) -> str | None:
        """How the last model turn ended (``stop``, ``tool_calls``, ``length``, ``content_filter``, ``refusal``,
        ``blocked``...), as its provider wrapper recorded it; None if it said nothing."""
        message = self.state.last_assistant
        reason = message.metadata.get("finish_reason") if message is not None else None
        return reason if isinstance(reason, str) else None

    @property
    def refusal(self) -> str | None:
        """The last model turn's refusal text, if the model refused."""
        message = self.state.last_assistant
        text = message.metadata.get("refusal") if message is not None else None
        return text if isinstance(text, str) else None

    @property
    def in_doubt(self) -> list[InDoubt]:
        """The calls of this turn (since the last user message) a resume found in doubt: the process died while
        they ran, or after they returned and before their record, so whether their effect happened is not known
        (their tool's ``on_in_doubt`` said not to run them again). The model was told; so is the caller."""
        asked = {}
        found: list[InDoubt] = []
        for message in self.state.messages[_turn_start(self.state.messages) :]:
            for call in message.tool_calls if message.role == "assistant" else ():
                asked[str(call.id)] = (call.name, message.message_id)
            for result in message.tool_results if message.role == "tool" else ():
                if result.status == "in_doubt":
                    name, message_id = asked.get(str(result.call_id), (None, None))
                    key = ledger_key(message_id, result.call_id)
                    found.append(InDoubt(name, str(result.call_id), key, str(result.output)))
        return found

    @property
    def outcome(self) -> str:
        """What the run ended with, refusals and blocks told apart from answers: ``completed``, ``in_doubt`` (it
        finished, but a call's effect is not known: :attr:`in_doubt`), ``refused``, ``blocked`` (the prompt or
        the reply was filtered), ``truncated`` (cut at the token limit), or the status when the run did not
        finish (``interrupted``, ``error``, ``running``); ``unfinished`` when the provider said the reply ended any
        other way (a malformed call, a reason it does not document): never taken for an answer."""
        if self.status != "done":
            return self.status
        if self.in_doubt:
            return "in_doubt"
        reason = self.finish_reason
        if reason == "refusal":
            return "refused"
        if reason in ("blocked", "content_filter"):
            return "blocked"
        if reason == "length":
            return "truncated"
        return "completed" if reason in (None, "stop", "tool_calls") else "unfinished"

    @property
    def usage(self) -> dict[str, int]:
        """Token counts summed over the thread's model turns (those whose provider reported them)."""
        total: dict[str, int] = {}
        for message in self.state.messages:
            counts = message.metadata.get("usage") if message.role == "assistant" else None
            for name, value in counts.items() if isinstance(counts, dict) else ():
                if isinstance(value, int):
                    total[name] = total.get(name, 0) + value
        return total

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
