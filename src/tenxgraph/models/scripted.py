"""ScriptedModel: a deterministic, offline model for tests, examples and the crash harness.

Its reply is chosen from the conversation it is shown (by default: the number of assistant messages in it), never
from hidden state, so a run resumed in a *new process* gets exactly the reply the dead process would have got.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tenxgraph.models.stream import MessageChunk, ToolCallChunk
from tenxgraph.state.messages import JSON, Message, TextBlock, ToolCallBlock
from tenxgraph.utils.errors import TenxGraphError


class ScriptExhaustedError(TenxGraphError):
    """The conversation went past the end of a ScriptedModel's script."""


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted assistant turn: text and/or tool calls ``(name, args)`` or ``(name, args, tool_call_id)``.

    Calls without an id get ``call_1``, ``call_2``... in order, repeating every turn as some providers do.
    """

    text: str = ""
    tool_calls: Sequence[tuple[str, dict[str, JSON]] | tuple[str, dict[str, JSON], str | None]] = field(
        default_factory=tuple
    )

    def to_message(self) -> Message:
        calls = []
        for i, spec in enumerate(self.tool_calls, 1):
            name, args = spec[0], spec[1]
            call_id = spec[2] if len(spec) > 2 else f"call_{i}"
            calls.append(ToolCallBlock(call_id, name, dict(args)))
        return Message.assistant(self.text, calls)


ScriptStep = Reply | str | Callable[[Sequence[Message]], Message | Reply | str]


def _assistant_turns(messages: Sequence[Message]) -> int:
    return sum(1 for m in messages if m.role == "assistant")


class ScriptedModel:
    """Replies ``script[i]`` where ``i = turn_of(messages)`` (default: assistant messages so far). It streams too
    (:meth:`astream`): the reply's words, then each call's arguments in two pieces, as a provider would."""

    provider = "scripted"

    def __init__(
        self,
        script: Sequence[ScriptStep],
        turn_of: Callable[[Sequence[Message]], int] = _assistant_turns,
    ) -> None:
        if not script:
            raise ValueError("ScriptedModel needs at least one scripted reply")
        self.script = list(script)
        self.turn_of = turn_of
        self.calls = 0  # how often agenerate ran in this process (for tests)

    async def agenerate(self, messages: Sequence[Message], tools: Sequence[dict[str, JSON]]) -> Message:
        self.calls += 1
        turn = self.turn_of(messages)
        if not 0 <= turn < len(self.script):
            raise ScriptExhaustedError(
                f"ScriptedModel has {len(self.script)} replies but the conversation asks for reply #{turn + 1}; "
                "add replies to the script"
            )
        step: Any = self.script[turn]
        if callable(step):
            step = step(messages)
        if isinstance(step, str):
            return Message.assistant(step)
        if isinstance(step, Reply):
            return step.to_message()
        if isinstance(step, Message):
            # a fresh id: a regenerated message is a new message (and gets new ledger keys)
            return Message(role="assistant", content=step.content, metadata=step.metadata)
        raise TypeError(f"script step #{turn + 1} produced {step!r}; expected a Reply, a str or a Message")

    async def astream(
        self, messages: Sequence[Message], tools: Sequence[dict[str, JSON]]
    ) -> AsyncIterator[MessageChunk | Message]:
        reply = await self.agenerate(messages, tools)
        for block in reply.content:
            if isinstance(block, TextBlock):
                words = block.text.split(" ")
                for n, word in enumerate(words):
                    yield MessageChunk(reply.message_id, text=word if n == len(words) - 1 else word + " ")
        for index, call in enumerate(reply.tool_calls):
            args = call.args if isinstance(call.args, str) else json.dumps(call.args)
            half = len(args) // 2
            yield MessageChunk(reply.message_id, tool_call=ToolCallChunk(index, call.id, call.name, args[:half]))
            yield MessageChunk(reply.message_id, tool_call=ToolCallChunk(index, args=args[half:]))
        yield reply
