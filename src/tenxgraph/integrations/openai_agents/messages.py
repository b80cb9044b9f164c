"""A run's conversation as tenxgraph messages (what the crash matrix reads of an OpenAI Agents SDK run): its
input, then each response's message text and function calls (each call under the ledger's id for it, as
:func:`~.tools.call_message_id` gives it), each call's output after it."""

from __future__ import annotations

from typing import Any

from tenxgraph.integrations.openai_agents.tools import call_message_id
from tenxgraph.state.messages import Message, ToolCallBlock, ToolResultBlock

__all__ = ["to_messages"]


def to_messages(result: Any) -> list[Message]:
    """*result* (``agents.RunResult``): its input items, and the items of its responses and their calls' outputs."""
    messages: list[Message] = []
    given = result.input if isinstance(result.input, list) else [{"role": "user", "content": result.input}]
    for n, item in enumerate(given):
        if isinstance(item, dict) and item.get("role") in ("user", "system", "developer"):
            content = item.get("content")
            text = content if isinstance(content, str) else str(content)
            if item["role"] == "user":
                messages.append(Message.user(text, message_id=f"input:{n}"))
            else:
                messages.append(Message.system(text, message_id=f"input:{n}"))
    outputs = {
        item.raw_item["call_id"]: item.raw_item.get("output")
        for item in result.new_items
        if getattr(item, "type", None) == "tool_call_output_item" and isinstance(item.raw_item, dict)
    }
    for n, response in enumerate(result.raw_responses):
        text = "".join(
            part.text
            for item in response.output
            if getattr(item, "type", None) == "message"
            for part in item.content
            if getattr(part, "type", None) == "output_text"
        )
        if text:
            messages.append(Message.assistant(text, message_id=f"response:{n}"))
        for item in response.output:
            if getattr(item, "type", None) != "function_call":
                continue
            block = ToolCallBlock(item.call_id, item.name, item.arguments or "{}")
            messages.append(Message.assistant(tool_calls=[block], message_id=call_message_id(item.id, item.call_id)))
            if item.call_id in outputs:
                output = outputs[item.call_id]
                text_out = output if isinstance(output, str) else str(output)
                result_block = ToolResultBlock(item.call_id, text_out, text_out.startswith("An error occurred"))
                messages.append(Message.tool(result_block, message_id=f"output:{item.call_id}"))
    return messages
