"""What watches one run while it happens: the caller's stream and the tracer.

The run loop makes one :class:`RunObserver` per run and passes it on explicitly: in the node's
:class:`~tenxgraph.core.tools.context.RunContext` (a model node streams its tokens through it), and to the ledger
(which reports each tool result as it is recorded or replayed, and opens each call's span). With no stream mode and
no tracer it does nothing, and costs an attribute check.

Stream modes (``app.stream(input, config, stream_mode=...)``, one or several):

- ``"updates"``: ``{node: update}`` after each node, ``update`` being ``{"messages": [...new...], field: value}``;
- ``"values"``: the whole state after each node, ``{"messages": [...all...], field: value, ...}``;
- ``"messages"``: ``(piece, metadata)`` as it happens: a model's tokens (:class:`~tenxgraph.models.stream.MessageChunk`
  of text, reasoning or tool-call arguments) while it streams, each tool result :class:`~tenxgraph.Message` as it is
  recorded or replayed (``metadata["replayed"]`` True when it came from the ledger, False when the tool ran), and
  any other message a node adds, whole, when the node ends; ``metadata`` also has ``node``, ``step``, ``thread_id``;
- ``"steps"``: the :class:`~tenxgraph.StreamEvent` of each finished node (``node``, ``step``, its new messages,
  ``replayed``): what ``stream`` yields without a mode;
- ``"result"``: the :class:`~tenxgraph.RunResult` at the end (status, interrupts, outcome).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tenxgraph.state.messages import Message

STREAM_MODES = ("updates", "values", "messages", "steps", "result")
Emit = Callable[[str, Any], None]


@dataclass(slots=True)
class RunObserver:
    """One run's stream sink (``emit(mode, chunk)`` for the modes asked for) and tracer (None: tracing is off)."""

    thread_id: str
    modes: frozenset[str] = frozenset()
    emit: Emit | None = None
    tracer: Any | None = None
    #: The OpenTelemetry context of the run's span: its nodes' spans are its children.
    parent: Any = None
    node: str = ""
    step: int = 0
    #: Messages already streamed whole or as chunks in ``"messages"`` mode (none is sent twice).
    streamed: set[str] = field(default_factory=set)
    #: The caller stopped reading: the run finishes the node under way and stops before the next one.
    stop: bool = False

    @property
    def wants_tokens(self) -> bool:
        """A caller streams ``"messages"``: a model that can stream should."""
        return self.emit is not None and "messages" in self.modes

    def metadata(self, **extra: Any) -> dict[str, Any]:
        return {"node": self.node, "step": self.step, "thread_id": self.thread_id, **extra}

    def chunk(self, chunk: Any) -> None:
        """A piece of a message a model is streaming (anything with a ``message_id``)."""
        if self.emit is not None and "messages" in self.modes:
            self.streamed.add(chunk.message_id)
            self.emit("messages", (chunk, self.metadata()))

    def message(self, message: Message, replayed: bool | None = None) -> None:
        """A complete message (a tool result as it is recorded or replayed), once."""
        if self.emit is None or "messages" not in self.modes or message.message_id in self.streamed:
            return
        self.streamed.add(message.message_id)
        extra = {"replayed": replayed} if replayed is not None else {}
        self.emit("messages", (message, self.metadata(**extra)))

    def node_done(self, node: str, messages: Iterable[Message], values: Mapping[str, Any], state: Any) -> None:
        """A node finished and its update is stored: its messages not streamed yet, its update, the state."""
        if self.emit is None:
            return
        messages = list(messages)
        for message in messages:
            replayed = bool(message.metadata.get("replayed")) if message.role == "tool" else None
            self.message(message, replayed)
        if "updates" in self.modes:
            self.emit("updates", {node: {"messages": messages, **values}})
        if "values" in self.modes:
            snapshot = {name: getattr(state, name) for name in state.field_names() if name != "meta"}
            self.emit("values", {**snapshot, "messages": list(state.messages)})
