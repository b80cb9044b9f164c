"""Calling a model from a node: :func:`generate`, what ``ReactAgent``'s model node does, for your own nodes too.

Inside a run, it streams the reply when the caller streams ``"messages"`` and the model can
(:class:`~tenxgraph.models.stream.StreamingChatModel`): each chunk reaches the caller as it arrives, and the node
gets the complete message, exactly what ``agenerate`` would have returned. It opens the ``chat {model}`` span when
the run is traced. Nothing of a streamed reply is stored until the node completes: a run that dies mid-stream runs
the model node again on resume, and the caller sees a new message (a new ``message_id``) stream from the start.
"""

from __future__ import annotations

from collections.abc import Sequence

from tenxgraph.core.crashpoints import crash_point
from tenxgraph.core.tools.context import current_run
from tenxgraph.core.tools.tracing import span
from tenxgraph.models.base import ChatModel
from tenxgraph.models.stream import StreamingChatModel
from tenxgraph.state.messages import JSON, Message
from tenxgraph.utils.errors import TenxGraphError


def _attributes(model: ChatModel) -> dict[str, str]:
    name = getattr(model, "model", None)
    found = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": str(getattr(model, "provider", "custom"))}
    return found | ({"gen_ai.request.model": name} if isinstance(name, str) else {})


async def generate(model: ChatModel, messages: Sequence[Message], tools: Sequence[dict[str, JSON]]) -> Message:
    """The model's next assistant message for *messages*, streamed to the run's caller when it asks for tokens."""
    ctx = current_run()
    observer = ctx.observer if ctx is not None else None
    tracer = observer.tracer if observer is not None else None
    attributes = _attributes(model) if tracer is not None else {}  # (nothing to build when tracing is off)
    with span(tracer, f"chat {attributes.get('gen_ai.request.model', type(model).__name__)}", attributes) as traced:
        reply: object = None
        if observer is not None and observer.wants_tokens and isinstance(model, StreamingChatModel):
            first = True
            async for item in model.astream(messages, tools):
                if isinstance(item, Message):
                    reply = item
                    continue
                observer.chunk(item)
                if first:  # the caller has seen part of a reply that nothing stores yet
                    first = False
                    crash_point("model.mid_stream")
        else:
            reply = await model.agenerate(messages, tools)
        if not isinstance(reply, Message) or reply.role != "assistant":
            raise TenxGraphError(f"the model returned {reply!r}; a ChatModel must return an assistant Message")
        if traced is not None:
            traced.set_attributes(_usage_attributes(reply))
    return reply


def _usage_attributes(reply: Message) -> dict[str, str | int | list[str]]:
    found: dict[str, str | int | list[str]] = {}
    usage, model, reason = (reply.metadata.get(k) for k in ("usage", "model", "finish_reason"))
    if isinstance(usage, dict):
        for ours, theirs in (
            ("input_tokens", "gen_ai.usage.input_tokens"),
            ("output_tokens", "gen_ai.usage.output_tokens"),
        ):
            if isinstance(usage.get(ours), int):
                found[theirs] = usage[ours]
    if isinstance(model, str):
        found["gen_ai.response.model"] = model
    if isinstance(reason, str):
        found["gen_ai.response.finish_reasons"] = [reason]
    return found
