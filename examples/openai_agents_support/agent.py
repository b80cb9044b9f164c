"""A support agent on the OpenAI Agents SDK, offline: a scripted ``agents.Model`` (new item ids and ``call_id``\\s
on every answer, as a provider's) asks for two parallel function calls, a refund and an email, then answers.

- :func:`run_support` (the after): the agent made replay-safe for the run (``replay_safe``): its model's turns
  journaled, its function calls through the ledger. Resumed by running it again with the same run id.
  :func:`run_support_streamed`: the same run streamed (``Runner.run_streamed``), as a UI shows it.
- :func:`run_bare` (the before): the SDK alone, with a session (``SQLiteSession``) that saves the run's items;
  after a crash its user runs the agent again on the session, and the turn's calls run again.
- :func:`run_approved` and :func:`run_bare_approved`: the same runs where the refund waits for a person
  (``needs_approval``): a run that pauses returns the SDK's result (its ``interruptions``); the person's answer
  comes back as the answered ``RunState``, saved as a string (``state``), and the run resumes from it."""

from __future__ import annotations

import uuid
from typing import Any

from agents import Agent, FunctionTool, RunConfig, Runner, RunResult, SQLiteSession, function_tool
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.run_state import RunState
from agents.usage import Usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
)

from tenxgraph.integrations.openai_agents import (
    current_idempotency_key,
    declare,
    replay_safe,
    run_replay_safe,
    stream_replay_safe,
    to_messages,
)
from tenxgraph.ledger import LedgerStore
from tenxgraph.state import Message

FINAL = "I refunded order A-1042 and emailed the customer."
#: No trace export (offline).
OFFLINE = RunConfig(tracing_disabled=True)


class ScriptedModel(Model):
    """The model: a request gets two parallel calls (refund, email); their outputs get the final answer."""

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        last = input[-1] if isinstance(input, list) and input else {}
        if isinstance(last, dict) and last.get("type") == "function_call_output":
            text = ResponseOutputText(text=FINAL, type="output_text", annotations=[])
            answer = ResponseOutputMessage(id=f"msg_{uuid.uuid4().hex}", role="assistant", status="completed",
                                           type="message", content=[text])  # fmt: skip
            return ModelResponse(output=[answer], usage=Usage(requests=1), response_id=f"resp_{uuid.uuid4().hex}")
        calls = [
            _call("refund_order", '{"order_id": "A-1042", "amount": 20.0}'),
            _call("send_email", '{"to": "ada@example.com", "subject": "Your refund"}'),
        ]
        return ModelResponse(output=calls, usage=Usage(requests=1), response_id=f"resp_{uuid.uuid4().hex}")

    async def stream_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        """The same answer, streamed as a provider streams it: each output item done, then the response."""
        answer = await self.get_response(system_instructions, input)
        for n, item in enumerate(answer.output):
            yield ResponseOutputItemDoneEvent(item=item, output_index=n, sequence_number=n,
                                              type="response.output_item.done")  # fmt: skip
        response = Response(id=answer.response_id or "resp", created_at=0.0, model="scripted", object="response",
                            output=answer.output, parallel_tool_calls=True, tool_choice="auto", tools=[])  # fmt: skip
        yield ResponseCompletedEvent(response=response, sequence_number=len(answer.output), type="response.completed")


def _call(name: str, arguments: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=f"fc_{uuid.uuid4().hex}", call_id=f"call_{uuid.uuid4().hex[:24]}", name=name, arguments=arguments,
        type="function_call", status="completed",
    )  # fmt: skip


def make_tools(effects: Any) -> list[FunctionTool]:
    @function_tool
    def refund_order(order_id: str, amount: float) -> str:
        """Refund an amount on an order."""
        key = current_idempotency_key()  # (None on the bare agent: no ledger)
        return str(effects.apply("refund", {"order": order_id, "amount": amount}, key)["effect_id"])

    @function_tool
    def send_email(to: str, subject: str) -> str:
        """Email the customer."""
        return str(effects.apply("email", {"to": to, "subject": subject}, current_idempotency_key())["effect_id"])

    # what each tool does, declared on it (replay_safe applies it; the crash matrix reads it on its own)
    return [declare(refund_order, effect="external"), declare(send_email, effect="idempotent")]


def build_agent(effects: Any, approval: bool = False) -> Agent[Any]:
    """The agent; *approval*: its refund waits for a person (``needs_approval``: the run is interrupted, and
    resumed from its ``RunState`` once approved)."""
    tools = make_tools(effects)
    tools[0].needs_approval = approval
    return Agent(name="support", instructions="Help with refunds.", model=ScriptedModel(), tools=tools)


async def run_support(thread_id: str, prompt: str, *, agent: Agent[Any], ledger: LedgerStore) -> list[Message]:
    """The run *thread_id* (its run id and ledger thread), started or resumed: its conversation."""
    durable = replay_safe(agent, ledger=ledger, run_id=thread_id)
    result = await run_replay_safe(durable, prompt, run_config=OFFLINE)  # (resumers of one run: in turn)
    return to_messages(result)


async def run_support_streamed(thread_id: str, prompt: str, *, agent: Agent[Any], ledger: LedgerStore) -> list[Message]:
    """:func:`run_support`, streamed (``Runner.run_streamed``): its events read as a UI would, under the run's lock."""
    durable = replay_safe(agent, ledger=ledger, run_id=thread_id)
    async with stream_replay_safe(durable, prompt, run_config=OFFLINE) as result:
        async for _event in result.stream_events():
            pass  # (a UI shows them)
    return to_messages(result)


async def run_bare(thread_id: str, prompt: str, *, agent: Agent[Any], sessions: str) -> list[Message]:
    """The SDK alone: the run saves its items in a session; a retried job runs the agent again on it."""
    session = SQLiteSession(thread_id, sessions)
    history = await session.get_items()
    result = await Runner.run(agent, [] if history else prompt, session=session, run_config=OFFLINE)
    return to_messages(result)


async def run_approved(
    thread_id: str, prompt: str, *, agent: Agent[Any], ledger: LedgerStore, state: str | None = None
) -> RunResult:
    """:func:`run_support` with approvals: started (or retried) from *prompt*, or resumed from the person's
    answered *state* (``result.to_state()`` answered, then ``to_string()``: what the approval endpoint receives).
    A run that pauses returns its result with ``interruptions``; ``run_replay_safe`` records the answers once."""
    durable = replay_safe(agent, ledger=ledger, run_id=thread_id)
    given = prompt if state is None else await RunState.from_string(durable, state)
    return await run_replay_safe(durable, given, run_config=OFFLINE)


async def run_bare_approved(
    thread_id: str, prompt: str, *, agent: Agent[Any], sessions: str, state: str | None = None
) -> RunResult:
    """:func:`run_bare` with approvals: the SDK alone resumes from whatever answered state it is sent."""
    session = SQLiteSession(thread_id, sessions)
    if state is not None:
        return await Runner.run(agent, await RunState.from_string(agent, state), session=session,
                                run_config=OFFLINE)  # fmt: skip
    history = await session.get_items()
    return await Runner.run(agent, [] if history else prompt, session=session, run_config=OFFLINE)
