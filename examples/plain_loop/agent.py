"""A support agent as many teams write it: no framework, a loop over ``chat.completions`` that calls their
functions. Two versions side by side:

- :func:`support_loop` (the after): each assistant message is stored, with its id, before any of its calls
  runs, and its calls run through the ledger (``tenxgraph.ledger.invoke_tool_calls``): keyed by that id and
  the call's ``tool_call_id``, a finished call is replayed on a resume, never run again;
- :func:`bare_support_loop` (the before): the same loop calling the functions itself. After a crash between a
  call's effect and its result being stored, the retried job runs the call again.

Either is resumed by calling it again with the same thread id (a retried job): it carries on from the
conversation it stored."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from examples.plain_loop.conversations import Conversations
from tenxgraph import tool
from tenxgraph.ledger import LedgerStore, Tool, ToolExecution, invoke_tool_calls
from tenxgraph.models.openai import to_openai_tools
from tenxgraph.state import Message, ToolCallBlock

MODEL = "gpt-4.1-mini"
#: The fields of a stored message that are the loop's own, not the provider's: left out of each request.
OWN_FIELDS = ("id", "is_error")


def make_tools(effects: Any) -> list[Tool]:
    """The agent's tools, declared to the ledger: the refund's effect is external (in doubt after a crash
    caught it in flight: not run again), the email idempotent under its key."""

    @tool(effect="external")
    def refund_order(order_id: str, amount: float, idempotency_key: str) -> str:
        """Refund an amount on an order."""
        return str(effects.apply("refund", {"order": order_id, "amount": amount}, idempotency_key)["effect_id"])

    @tool(effect="idempotent")
    def send_email(to: str, subject: str, idempotency_key: str) -> str:
        """Email the customer."""
        return str(effects.apply("email", {"to": to, "subject": subject}, idempotency_key)["effect_id"])

    return [refund_order, send_email]


async def support_loop(
    thread_id: str,
    prompt: str,
    *,
    client: Callable[[], Any],
    tools: list[Tool],
    ledger: LedgerStore,
    conversations: Conversations,
) -> list[dict[str, Any]]:
    """Answer *prompt* on *thread_id*, or carry on where a crashed run of it stopped. The conversation."""
    by_name = {t.name: t for t in tools}
    history = conversations.load(thread_id)
    resumed = bool(history)
    if not history:
        history = [{"role": "user", "content": prompt}]
        conversations.append(thread_id, history)
    openai = client()
    while True:
        last = history[-1]
        if last["role"] == "assistant" and last.get("tool_calls"):  # stored, its calls not answered yet
            results = await run_calls(last, by_name, ledger, thread_id, resumed)
            conversations.append(thread_id, results)
            history += results
            continue
        if last["role"] == "assistant":
            return history
        message = await ask_model(openai, history, [t.schema() for t in tools])
        conversations.append(thread_id, [message])  # stored before any of its calls runs
        history.append(message)


async def run_calls(
    assistant: Mapping[str, Any], tools: Mapping[str, Tool], ledger: LedgerStore, thread_id: str, resumed: bool
) -> list[dict[str, Any]]:
    """The assistant message's calls, run (or replayed) through the ledger: their tool messages, in call order."""
    calls = [ToolCallBlock(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in assistant["tool_calls"]]
    message = Message.assistant(tool_calls=calls, message_id=assistant["id"])  # keyed by the id stored with it
    executions = await invoke_tool_calls(message, tools, ledger, thread_id, resumed=resumed)
    return [tool_message(e) for e in executions]


async def ask_model(openai: Any, history: list[dict[str, Any]], schemas: list[Any]) -> dict[str, Any]:
    """The model's next message for *history*, with the response's id kept beside it (the loop's ``id``)."""
    completion = await openai.chat.completions.create(
        model=MODEL, messages=[request_form(m) for m in history], tools=to_openai_tools(schemas)
    )
    return {**completion.choices[0].message.model_dump(exclude_none=True), "id": completion.id}


def tool_message(execution: ToolExecution) -> dict[str, Any]:
    output = execution.result.output
    content = output if isinstance(output, str) else json.dumps(output)
    return {"role": "tool", "tool_call_id": execution.call.id, "content": content,
            "is_error": execution.result.is_error}  # fmt: skip


def request_form(message: Mapping[str, Any]) -> dict[str, Any]:
    """A stored message as the provider takes it (the loop's own fields left out)."""
    return {k: v for k, v in message.items() if k not in OWN_FIELDS}


# -- the before --------------------------------------------------------------------------------------------------
def bare_functions(effects: Any) -> dict[str, Callable[..., str]]:
    """The same two functions, as a loop without a ledger calls them."""

    def refund_order(order_id: str, amount: float) -> str:
        return str(effects.apply("refund", {"order": order_id, "amount": amount})["effect_id"])

    def send_email(to: str, subject: str) -> str:
        return str(effects.apply("email", {"to": to, "subject": subject})["effect_id"])

    return {"refund_order": refund_order, "send_email": send_email}


async def bare_support_loop(
    thread_id: str, prompt: str, *, client: Callable[[], Any], schemas: list[Any], effects: Any,
    conversations: Conversations,
) -> list[dict[str, Any]]:  # fmt: skip
    """:func:`support_loop` without the ledger: it runs each stored message's calls itself (*schemas*: what the
    model is shown of the functions)."""
    functions = bare_functions(effects)
    history = conversations.load(thread_id)
    if not history:
        history = [{"role": "user", "content": prompt}]
        conversations.append(thread_id, history)
    openai = client()
    while True:
        last = history[-1]
        if last["role"] == "assistant" and last.get("tool_calls"):
            results = []
            for call in last["tool_calls"]:
                output = functions[call["function"]["name"]](**json.loads(call["function"]["arguments"]))
                results.append({"role": "tool", "tool_call_id": call["id"], "content": output})
            conversations.append(thread_id, results)
            history += results
            continue
        if last["role"] == "assistant":
            return history
        message = await ask_model(openai, history, schemas)
        conversations.append(thread_id, [message])
        history.append(message)
