"""A Pydantic AI agent in a crash-matrix cell (``@pytest.mark.crash_matrix(framework="pydantic_ai")``): how a run
is started, resumed and read back, the durable agent and the bare one each as its user runs it. Pydantic AI is
imported only when a test drives an agent.

- **Durable** (the agent has ``LedgerDurability``): ``agent.run(prompt, run_id=..., conversation_id=...)``
  (``run_stream`` in the ``stream`` mode); a resume is the same run again, as docs/pydantic-ai.md says. The
  harness's thread is the ledger's thread of the conversation (``pydantic-ai:{agent}:{conversation}``).
- **Bare** (no durability): its user keeps the run's message history, saved after every step of ``agent.iter``
  (``pydantic_ai.after_model_response`` fires before a new response is saved, ``pydantic_ai.after_model_record``
  after), and a resume runs the agent again on the saved history (Pydantic AI runs the calls of a response that
  ends it), or on the prompt if nothing was saved: what Pydantic AI alone offers after a crash.

Every run is passed the harness's :class:`~.pydantic_ai_watch.CallWatch`; the bodies of the agent's function tools
are witnessed (:func:`~.pydantic_ai_watch.witness_bodies`). In the ``resumers`` mode a resume is sent by k
processes at once, then once more by the harness. With the ``approvals`` fixture, a run that comes back paused
(``DeferredToolRequests``) is answered as its user would answer it (:mod:`.pydantic_ai_pauses`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_replaysafe.judge.evidence import ExecutionLog
from tenxgraph.core.crashpoints import crash_point
from tenxgraph.core.graph.results import RunResult
from tenxgraph.state.state import AgentState
from tenxgraph.utils.sync import run_sync

if TYPE_CHECKING:
    from pytest_replaysafe.run.approvals import Approvals, AtOnce

PYDANTIC_AI_EXTRA = "pip install 'tenxgraph[pydantic-ai]'"
#: What ``crash_run.invoke(agent, input)`` takes in *input*: ``agent.run``'s arguments a test may choose.
RUN_ARGUMENTS = ("user_prompt", "deps")


def is_pydantic_ai_agent(app: object) -> bool:
    """A Pydantic AI agent (``pydantic_ai.Agent`` or a wrapper of one), told without importing Pydantic AI."""
    return any(c.__module__.startswith("pydantic_ai.agent") for c in type(app).__mro__)


def durability_of(agent: Any) -> Any:
    """The agent's ``LedgerDurability`` (None: a bare agent), found among its capabilities."""
    from tenxgraph.integrations.pydantic_ai import LedgerDurability

    stack: list[Any] = [agent.root_capability]
    while stack:
        capability = stack.pop()
        if isinstance(capability, LedgerDurability):
            return capability
        stack += [*(getattr(capability, "capabilities", None) or ()), getattr(capability, "wrapped", None)]
        stack = [c for c in stack if c is not None]
    return None


class PydanticAIApp:
    """A Pydantic AI agent as the cell driver runs it: started, resumed and read back on a thread."""

    def __init__(self, agent: Any, input: Mapping[str, Any], log: ExecutionLog, workdir: Path) -> None:
        from pytest_replaysafe.run.pydantic_ai_watch import witness_bodies

        unknown = sorted(set(input) - set(RUN_ARGUMENTS))
        if unknown or "user_prompt" not in input:
            raise pytest.UsageError(
                f"crash_run.invoke(agent, input): a Pydantic AI agent's input is a dict of agent.run's arguments "
                f"{list(RUN_ARGUMENTS)} with user_prompt, e.g. {{'user_prompt': 'Refund order 1042'}}; "
                f"got {dict(input)}"
            )
        self.agent, self.input, self.log, self.workdir = agent, dict(input), log, workdir
        self.durability = durability_of(agent)
        name = self.durability.name if self.durability is not None else agent.name
        if not name:
            raise pytest.UsageError(
                "crash_run.invoke: the Pydantic AI agent has no name: give it one (Agent(..., name='support')); "
                "its runs' records are named after it"
            )
        #: The harness's threads: the ledger's thread of each conversation, whose id is the rest of the name.
        self.thread_prefix = f"pydantic-ai:{name}:"
        witness_bodies(agent)

    def run(
        self,
        input: Mapping[str, Any] | None,
        thread: str,
        config: Mapping[str, Any],
        stream: bool,
        approvals: Approvals | None = None,
        at_once: AtOnce | None = None,
    ) -> RunResult[Any]:
        """Start the run (*input*), or resume the thread (None), as the agent's user would; *at_once*: the resume
        is sent by many processes at once first (the ``resumers`` mode). With *approvals*, a run that comes back
        paused (``DeferredToolRequests``) is answered until it ends (:mod:`.pydantic_ai_pauses`)."""
        from pytest_replaysafe.run.pydantic_ai_pauses import answer_deferred, is_paused

        resume = input is None
        if at_once is not None and resume:
            at_once(lambda: self._send(thread, resume, stream))
        output = self._send(thread, resume, stream)
        if approvals is not None:
            answer_deferred(output, lambda: self._load(thread) or [], partial(self._answer, thread),
                            (thread, self.durability is None), approvals, self.log, at_once)  # fmt: skip
        elif is_paused(output):
            raise pytest.UsageError(
                "crash_run.invoke: the Pydantic AI agent's run paused for approval (DeferredToolRequests): request "
                "the approvals fixture in the test, and the harness answers it as a person would"
            )
        return self.result(thread)

    def _kw(self, thread: str) -> dict[str, Any]:
        from pytest_replaysafe.run.pydantic_ai_watch import CallWatch

        watch = CallWatch(thread, self.log, self.durability)
        return {"capabilities": [watch], **{k: v for k, v in self.input.items() if k == "deps"}}

    def _send(self, thread: str, resume: bool, stream: bool) -> object:
        """One run of the agent (the run, or its resume), its history saved: the run's output (None: a bare run
        that had ended)."""
        conversation = thread.removeprefix(self.thread_prefix)
        kw = self._kw(thread)
        if self.durability is not None:  # the same run again, by its run_id: the journal and ledger replay it
            kw |= {"run_id": conversation, "conversation_id": conversation}
            messages, output = run_sync(self._durable(self.input["user_prompt"], stream, kw))
            self._save(thread, messages)
            return output
        saved = self._load(thread) if resume else None  # the bare agent's user: its saved history, if any
        if saved and _finished(saved):
            return None  # (the run had ended: its last response answered without asking for a tool)
        prompt = None if saved else self.input["user_prompt"]
        return run_sync(self._stepped(thread, prompt, saved, stream, kw))

    def _answer(self, thread: str, results: Any, history: list[Any]) -> object:
        """The paused run (its *history*) answered (*results*: ``DeferredToolResults``), as Pydantic AI's docs
        do: through ``aresume_once`` on the durable agent, a run given them on the bare one. Its output."""
        from tenxgraph.integrations.pydantic_ai import aresume_once

        kw = self._kw(thread)
        if self.durability is None:
            return run_sync(self._stepped(thread, None, history, False, {**kw, "deferred_tool_results": results}))
        result = run_sync(aresume_once(self.agent, results, message_history=history, **kw))
        self._save(thread, list(result.all_messages()))
        return result.output

    async def _durable(self, prompt: Any, stream: bool, kw: dict[str, Any]) -> tuple[list[Any], object]:
        """The durable agent's run (``run``, or ``run_stream`` read to its end): its messages and output. (On the
        loop of tenxgraph's sync wrappers, which a forked child makes anew: Pydantic AI's ``run_sync`` would
        not.)"""
        if not stream:
            result = await self.agent.run(prompt, **kw)
            return list(result.all_messages()), result.output
        async with self.agent.run_stream(prompt, **kw) as run:
            async for _ in run.stream_output(debounce_by=None):
                pass
            return list(run.all_messages()), await run.get_output()

    async def _stepped(self, thread: str, prompt: Any, saved: list[Any] | None, stream: bool, kw: Any) -> object:
        """A bare agent's run, its history saved after every step (a new response: between the two points): its
        output."""
        from pydantic_ai import Agent

        async with self.agent.iter(prompt, message_history=saved, **kw) as run:
            node = run.next_node
            while not Agent.is_end_node(node):
                if stream and Agent.is_model_request_node(node):
                    events: Any
                    async with node.stream(run.ctx) as events:
                        async for _ in events:
                            pass
                node = await run.next(node)
                messages = run.all_messages()
                answered = Agent.is_call_tools_node(node)  # (the model's response is in, its tools not run)
                if answered:
                    crash_point("pydantic_ai.after_model_response")
                self._save(thread, messages)
                if answered:
                    crash_point("pydantic_ai.after_model_record")
            return run.result.output if run.result is not None else None

    # -- the stored conversation ----------------------------------------------------------------------------------
    def _path(self, thread: str) -> Path:
        return self.workdir / f"{thread.replace(':', '_')}.pydantic-ai.json"

    def _save(self, thread: str, messages: list[Any]) -> None:
        """Save the run's history (atomically: a kill leaves the previous one or this one)."""
        from pydantic_ai.messages import ModelMessagesTypeAdapter

        path = self._path(thread)
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        part.write_bytes(ModelMessagesTypeAdapter.dump_json(messages))
        os.replace(part, path)

    def _load(self, thread: str) -> list[Any] | None:
        from pydantic_ai.messages import ModelMessagesTypeAdapter

        path = self._path(thread)
        return list(ModelMessagesTypeAdapter.validate_json(path.read_bytes())) if path.exists() else None

    def result(self, thread: str) -> RunResult[Any]:
        """The thread's conversation as its last run left it, as tenxgraph messages (what the verdict reads)."""
        from tenxgraph.integrations.pydantic_ai import to_messages

        messages = self._load(thread)
        if messages is None:
            raise RuntimeError(f"thread {thread!r} has no saved Pydantic AI run after the run")
        return RunResult(thread, AgentState(messages=to_messages(messages)), 0)


def _finished(messages: list[Any]) -> bool:
    """A saved history whose last response is an answer that asks for no tool: that run ended."""
    from pydantic_ai.messages import ModelResponse

    last = messages[-1]
    return isinstance(last, ModelResponse) and not last.tool_calls


#: The tests already told that their marker is not for a Pydantic AI agent (told once each: their other cells skip).
_told: set[str] = set()


def checked(agent: Any, input: Any, log: ExecutionLog, workdir: Path, where: tuple[str, str, bool]) -> PydanticAIApp:
    """The agent as a cell runs it, once its test's marker (*where*: node id, framework, in a cell) is checked."""
    framework_matches(*where, _told)
    if isinstance(input, list):
        raise pytest.UsageError("crash_run.conversation drives tenxgraph graphs; drive a Pydantic AI agent by invoke")
    return PydanticAIApp(agent, input, log, workdir)


def framework_matches(nodeid: str, framework: str, in_a_cell: bool, told: set[str]) -> None:
    """A Pydantic AI agent driven by a test whose marker expanded another framework's cells: one clear failure
    naming the marker's argument, then its other cells skip (*told*: the tests already told)."""
    if framework == "pydantic_ai" or not in_a_cell:
        return
    test = nodeid.split("[", 1)[0]
    said = (
        f"{test}: crash_run.invoke got a Pydantic AI agent, but its @pytest.mark.crash_matrix expands {framework}'s "
        "cells (points and modes a Pydantic AI agent never reaches): mark it "
        '@pytest.mark.crash_matrix(framework="pydantic_ai")'
    )
    if test in told:
        pytest.skip(f"{said} (said once, in this test's first cell)")
    told.add(test)
    pytest.fail(said, pytrace=False)
