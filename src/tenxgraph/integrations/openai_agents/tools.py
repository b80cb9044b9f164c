"""The agent's function tools through the ledger: :func:`replay_safe` makes a copy of an ``agents.Agent`` for one
run, its model journaled (:mod:`.journal`) and each ``FunctionTool``'s ``on_invoke_tool`` run through the
ledger's public entry (:func:`tenxgraph.ledger.invoke_tool_call`).

A call's ledger key is the response item that asked for it (the ``function_call`` item's id, journaled with its
response, or its ``call_id`` where the model gives items no ids of their own, as the Chat Completions model
does) and its ``call_id``: the same in every process that resumes the run. What is recorded is the tool's
output (text, or JSON; another object as its text). A tool that raised (one whose ``failure_error_function`` is
None) is recorded as failed: the run that ran it gets its exception, a resumed run tells the model it failed,
and it never runs again. A call the ledger settles in doubt tells the model so, as its output."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from agents import Agent, FunctionTool, Handoff
from agents.models.fake_id import FAKE_RESPONSES_ID
from agents.models.interface import Model
from agents.tool_context import ToolContext

from tenxgraph.integrations.openai_agents.journal import JournaledModel
from tenxgraph.ledger import (
    CallGroups,
    Effect,
    LedgerStore,
    Reconcile,
    Tool,
    ToolExecution,
    ToolOutput,
    check_policy,
    current_idempotency_key,
    effect_from_hints,
    invoke_tool_call,
)
from tenxgraph.state.messages import Message, ToolCallBlock
from tenxgraph.utils.errors import ConfigError

__all__ = ["DECLARATION", "call_message_id", "current_idempotency_key", "declaration_of", "declare", "replay_safe"]


def call_message_id(item_id: str | None, call_id: str) -> str:
    """The ledger's message id of a function call: its response item's id, or its ``call_id`` where the model
    gives the item none of its own."""
    return item_id if item_id and item_id != FAKE_RESPONSES_ID else f"call:{call_id}"


#: Where :func:`declare` keeps a function tool's declaration (read by ``replay_safe`` and by a test harness).
DECLARATION = "__tenxgraph_declaration__"


def declare(
    tool: FunctionTool, *, effect: Effect | str | None = None, on_in_doubt: str | None = None,
    reconcile: Reconcile | None = None,
) -> FunctionTool:  # fmt: skip
    """Declare what *tool* does, as ``@tool`` takes it (checked now): its effect class, in-doubt policy and
    reconcile function; ``replay_safe`` applies it to every run (a tool declared here is not declared again
    there). *tool*, declared."""
    check_policy(on_in_doubt, reconcile, effect)
    said = Effect.parse(effect)
    setattr(tool, DECLARATION, (said.value if said is not None else None, on_in_doubt, reconcile))
    return tool


def declaration_of(tool: FunctionTool) -> tuple[str | None, str | None, Reconcile | None]:
    """What :func:`declare` said of *tool*: effect class, in-doubt policy, reconcile function (all None: nothing)."""
    found = getattr(tool, DECLARATION, None)
    return found if isinstance(found, tuple) else (None, None, None)


def replay_safe(
    agent: Agent[Any],
    *,
    ledger: LedgerStore,
    run_id: str,
    thread_id: str | None = None,
    model: Model | None = None,
    effects: Mapping[str, Effect | str] | None = None,
    on_in_doubt: Mapping[str, str] | None = None,
    reconcile: Mapping[str, Reconcile] | None = None,
) -> Agent[Any]:
    """A copy of *agent* for run *run_id*: its model journaled and its function tools through *ledger*, on the
    ledger thread *thread_id* (default: the run id). *model*: the ``agents.Model`` to journal where the agent
    names its model by a string. Per tool name: its effect class (*effects*), in-doubt policy (*on_in_doubt*)
    and reconcile function (*reconcile*), as ``@tool`` takes them. Make one per run (a resume is a new run of
    the copy, with the same input and ``run_id``).

    The agents it hands off to (``handoffs``: agents, or ``Handoff`` objects whose agent is made a copy when the
    handoff is taken) are copied alike, each model journaled under the run's id and the agent's name, each
    function tool through the ledger, on the same thread; the per-name settings apply to every agent's tools."""
    said = _Said(effects or {}, on_in_doubt or {}, reconcile or {})
    copies = _Copies(ledger, thread_id or run_id, run_id, said)
    durable = copies.of(agent, model)
    rest = said.told() - copies.tool_names
    for calls in copies.mcp_calls:  # (MCP tools': checked when the servers list their tools)
        calls.declared.update({name: said.policy(name) for name in sorted(rest)})
        calls.strict = len(copies.made) == 1  # (several agents: a name may be another agent's tool)
    if rest and not copies.mcp_calls and not copies.open_ended:
        names = sorted(copies.tool_names)
        raise ConfigError(f"replay_safe: {sorted(rest)} are not function tools of agent {agent.name!r}: {names}")
    return durable


@dataclasses.dataclass(frozen=True)
class _Said:
    effects: Mapping[str, Effect | str]
    on_in_doubt: Mapping[str, str]
    reconcile: Mapping[str, Reconcile]

    def told(self) -> set[str]:
        return {*self.effects, *self.on_in_doubt, *self.reconcile}

    def policy(self, name: str) -> tuple[str | None, Reconcile | None, Effect | None]:
        """What replay_safe's arguments say of tool *name*: in-doubt policy, reconcile, effect (checked)."""
        policy, fix = self.on_in_doubt.get(name), self.reconcile.get(name)
        return policy, fix, check_policy(policy, fix, self.effects.get(name))


class _Copies:
    """The run's copies of an agent and of the agents it hands off to, one per agent (handoffs may loop)."""

    def __init__(self, ledger: LedgerStore, thread: str, run_id: str, said: _Said) -> None:
        self.ledger, self.thread, self.run_id, self.said = ledger, thread, run_id, said
        self.made: dict[int, Agent[Any]] = {}
        self.tool_names: set[str] = set()
        self.open_ended = False  # (a Handoff object: its agent is known when the handoff is taken)
        self.mcp_calls: list[_LedgerCalls] = []  # (the agents with MCP servers: their tools are listed later)

    def of(self, agent: Agent[Any], model: Model | None = None) -> Agent[Any]:
        if id(agent) in self.made:
            return self.made[id(agent)]
        inner = model if model is not None else agent.model
        if not isinstance(inner, Model):
            raise ConfigError(
                f"replay_safe: agent {agent.name!r} names its model by {inner!r}, not an agents.Model: pass the "
                "model to journal, replay_safe(agent, ..., model=OpenAIResponsesModel(model=..., openai_client=...))"
                + ("" if not self.made else " (an agent handed off to: give it an agents.Model itself)")
            )
        if agent.mcp_servers and type(agent) is not Agent:
            raise ConfigError(
                f"replay_safe: agent {agent.name!r} is a {type(agent).__name__} with MCP servers: only an "
                "agents.Agent's MCP tools can be run through the ledger"
            )
        first = not self.made
        run_id = self.run_id if first else f"{self.run_id}/{agent.name}"  # (the journal: one turn order per agent)
        calls = _LedgerCalls(self.ledger, self.thread, self.policies(agent))
        names = {t.name for t in agent.tools if isinstance(t, FunctionTool)}
        self.tool_names |= names
        tools = [calls.wrap(t) if isinstance(t, FunctionTool) else t for t in agent.tools]
        durable = agent.clone(model=JournaledModel(inner, self.ledger, self.thread, run_id), tools=tools)
        if agent.mcp_servers:
            from tenxgraph.integrations.openai_agents.mcp import LedgerMcpAgent

            given = {f.name: getattr(durable, f.name) for f in dataclasses.fields(durable) if f.init}
            durable = LedgerMcpAgent(**given, ledger_calls=calls)
            self.mcp_calls.append(calls)
        self.made[id(agent)] = durable
        durable.handoffs = [self.handoff(h) for h in agent.handoffs]
        return durable

    def handoff(self, target: Any) -> Any:
        if isinstance(target, Agent):
            return self.of(target)
        if not isinstance(target, Handoff):
            raise ConfigError(
                f"replay_safe: handoff {target!r} is neither an agents.Agent nor an agents.Handoff: its agent's "
                "tools would run outside the ledger"
            )
        self.open_ended = True
        invoke = target.on_invoke_handoff

        async def on_invoke_handoff(context: Any, input_json: str) -> Any:
            return self.of(await invoke(context, input_json))

        taken = copy.copy(target)
        taken.on_invoke_handoff = on_invoke_handoff
        return taken

    def policies(self, agent: Agent[Any]) -> dict[str, tuple[str | None, Reconcile | None, Effect | None]]:
        told = self.said.told()
        policies: dict[str, tuple[str | None, Reconcile | None, Effect | None]] = {}
        for tool in agent.tools:
            if not isinstance(tool, FunctionTool):
                continue
            if tool.name in told and hasattr(tool, DECLARATION):
                raise ConfigError(
                    f"replay_safe: function tool {tool.name!r} is declared twice (declare() on the tool, and "
                    "replay_safe's effects=/on_in_doubt=/reconcile=): say it once"
                )
            if tool.name in told:
                policies[tool.name] = self.said.policy(tool.name)
            else:
                effect, policy, fix = declaration_of(tool)
                policies[tool.name] = (policy, fix, check_policy(policy, fix, effect))
        return policies


class _LedgerCalls:
    """The run's function calls through the ledger (*policies*: per tool, in-doubt policy, reconcile, effect)."""

    def __init__(
        self, ledger: LedgerStore, thread: str, policies: dict[str, tuple[str | None, Reconcile | None, Effect | None]]
    ) -> None:
        self.ledger, self.thread, self.policies = ledger, thread, policies
        self.groups = CallGroups()
        #: Declared per run for tools the agent does not have before its MCP servers list theirs.
        self.declared: dict[str, tuple[str | None, Reconcile | None, Effect | None]] = {}
        self.listed = False
        #: Refuse a name declared for the run that is no tool of the agent's (False: several agents share them).
        self.strict = True

    def learn_mcp(self, tools: list[Any]) -> None:
        """Each MCP tool's policy, from the run's declaration or the tool's annotations (*tools*: the function
        tools the SDK made of its servers' listing, which keep their annotations); the first time, a name
        declared for the run that is no tool at all is refused."""
        for tool in tools:
            if tool.name in self.policies:
                continue
            annotations = tool.mcp_annotations
            hints = annotations.model_dump() if annotations is not None else {}
            said = self.declared.get(tool.name)
            self.policies[tool.name] = said or (None, None, effect_from_hints(hints) or Effect.EXTERNAL)
        unknown = sorted(set(self.declared) - set(self.policies))
        if unknown and not self.listed and self.strict:
            raise ConfigError(
                f"replay_safe: {unknown} are neither function tools of the agent nor tools its MCP servers list: "
                f"{sorted(self.policies)}"
            )
        self.listed = True

    def wrap(self, tool: FunctionTool) -> FunctionTool:
        invoke = tool.on_invoke_tool

        async def on_invoke_tool(ctx: ToolContext[Any], input: str) -> Any:
            return await self.call(tool.name, invoke, ctx, input)

        wrapped = copy.copy(tool)
        wrapped.on_invoke_tool = on_invoke_tool
        return wrapped

    async def call(self, name: str, invoke: Any, ctx: ToolContext[Any], input: str) -> Any:
        item_id = getattr(ctx.tool_call, "id", None)
        block = ToolCallBlock(ctx.tool_call_id, name, input or "{}")
        message = Message.assistant(tool_calls=[block], message_id=call_message_id(item_id, ctx.tool_call_id))
        raised: list[Exception] = []

        async def run(**_: Any) -> ToolOutput:
            try:
                output = await invoke(ctx, input)
            except Exception as exc:
                raised.append(exc)
                raise
            return ToolOutput(_recordable(output))

        on_in_doubt, reconcile, effect = self.policies.get(name, (None, None, Effect.EXTERNAL))  # (unlisted: safe)
        params = {"type": "object", "properties": {arg: {} for arg in _args(input)}}
        ledger_tool = Tool(name=name, description="", fn=run, parameters=params, is_async=True,
                           on_in_doubt=on_in_doubt, reconcile=reconcile, effect=effect)  # fmt: skip
        group = self.groups.join(self.ledger, self.thread, message)
        try:
            execution = await invoke_tool_call(message, 0, {name: ledger_tool}, self.ledger, self.thread, group=group)
        finally:
            self.groups.passed(group)
        return _output(execution, raised)


def _args(input: str) -> dict[str, Any]:
    try:
        parsed = json.loads(input) if input and input.strip() else {}
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _recordable(output: Any) -> Any:
    """The tool's output as the ledger records it: JSON as it is, another object as its text (what the SDK
    shows the model of it)."""
    try:
        json.dumps(output)
    except (TypeError, ValueError):
        return str(output)
    return output


def _output(execution: ToolExecution, raised: list[Exception]) -> Any:
    """What the SDK gets for the call: its recorded output; for a failed call, the exception it raised here, or
    (replayed, in doubt, timed out) the failure's text, which the model sees as the call's output."""
    result = execution.result
    if result.is_error and raised and not execution.replayed:
        raise raised[-1]
    if result.is_error:
        return f"An error occurred while running the tool: {result.output}"
    return result.output
