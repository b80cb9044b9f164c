"""A plain agent loop in a crash-matrix cell (``@pytest.mark.crash_matrix(framework="loop")``): a function its user
wrote over a provider's SDK (``chat.completions``, the Responses API) that runs each assistant message's calls
through the public ledger entry (``tenxgraph.ledger.invoke_tool_calls``), as docs/plain-loop.md shows.

The harness calls it as its user's job runner would: ``loop(thread_id=..., **input)``, and a resume is the same
call again (a retried job): the loop carries on from the conversation it stored. What it returns is that
conversation, in the provider's chat format (dicts with ``role``, ``content``, ``tool_calls``,
``tool_call_id``), with two fields of the loop's own: ``id`` on an assistant message (the id its calls are keyed
by in the ledger) and ``is_error`` on a tool message. The harness saves each returned conversation in the cell's
folder (what the verdict reads after a run in a killed child) and reads it back as tenxgraph messages.

The tools the harness witnesses are the ledger ``Tool`` objects the loop can reach (the arguments of a
``functools.partial``, a closure's cells, a bound method's object, the globals its code names): found on its
own, before the first run, never from the ledger's account of what it called."""

from __future__ import annotations

import functools
import inspect
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_replaysafe.judge.evidence import ExecutionLog
from pytest_replaysafe.run.effects import in_loop
from pytest_replaysafe.run.openai_agents_pauses import is_sdk_result
from pytest_replaysafe.run.openai_agents_watch import is_function_tool, witness_function_tools
from tenxgraph.core.graph.results import RunResult
from tenxgraph.core.tools.tool import Tool
from tenxgraph.state.messages import Message, ToolCallBlock, ToolResultBlock
from tenxgraph.state.state import AgentState
from tenxgraph.utils.sync import run_sync

#: How far the harness looks for the loop's tools through containers and objects.
_DEPTH = 4
#: How a tenxgraph message the loop returned is kept in the cell's folder.
TENXGRAPH = "tenxgraph_message"


def is_loop(app: object) -> bool:
    """A plain function, coroutine function, bound method or ``functools.partial`` of one: a loop its user wrote."""
    return inspect.isfunction(app) or inspect.ismethod(app) or isinstance(app, functools.partial)


def checked(
    loop: Any, input: Any, options: object, workdir: Path, where: tuple[str, str, bool], log: ExecutionLog
) -> LoopApp:
    """The loop as a cell runs it, once its test's marker (*where*: node id, framework, in a cell) is checked: a
    loop driven by a test whose marker expanded another framework's cells (points a loop never reaches) fails,
    naming the marker's argument. *options*: a config or streaming asked for (a loop takes neither)."""
    nodeid, framework, in_a_cell = where
    if framework not in ("loop", "openai_agents") and in_a_cell:
        pytest.fail(
            f"{nodeid.split('[', 1)[0]}: crash_run.invoke got a plain loop (a function), but its "
            f"@pytest.mark.crash_matrix expands {framework}'s cells: mark it "
            '@pytest.mark.crash_matrix(framework="loop") (or "openai_agents" for a function that runs an agent)',
            pytrace=False,
        )
    if isinstance(input, list) or options:
        raise pytest.UsageError(
            "crash_run drives a plain loop by crash_run.invoke(loop, input) only: no config, stream or conversation"
        )
    return LoopApp(loop, input, workdir, log)


class LoopApp:
    """A plain loop as the cell driver runs it: called, called again to resume, its conversation read back."""

    def __init__(self, loop: Callable[..., Any], input: Mapping[str, Any], workdir: Path, log: ExecutionLog) -> None:
        if not isinstance(input, Mapping) or "thread_id" in input:
            raise pytest.UsageError(
                "crash_run.invoke(loop, input): a plain loop's input is a dict of its keyword arguments, without "
                f"thread_id (the harness passes it: loop(thread_id=..., **input)); got {input!r}"
            )
        self.loop, self.input, self.workdir, self.log = loop, dict(input), workdir, log
        found = list(reachable_tools(loop))
        self.tools = [t for t in found if isinstance(t, Tool)]
        function_tools = [t for t in found if not isinstance(t, Tool)]  # an OpenAI Agents SDK agent's
        witness_function_tools(function_tools, log)
        #: The tools whose calls the verdict judges (their bodies are witnessed): a call of a function the
        #: harness cannot reach is judged by its effects alone (counted outside, on the loop's thread).
        self.judged = frozenset(t.name for t in found)
        self.thread_prefix = ""
        #: ``double-resume``: each answer to a pause sent twice, and a different one first on a resume.
        self.double_resume = False

    def run(
        self, input: Mapping[str, Any] | None, thread: str, config: Any, stream: bool, approvals: Any = None,
        at_once: Callable[[Callable[[], object]], None] | None = None,
    ) -> RunResult[Any]:  # fmt: skip
        """Start the loop on *thread*, or resume it (*input* None): the same call again, with the answer to its
        pause it was last sent, if any; *at_once*: the resume is made by many processes at once first (the
        ``resumers`` mode), then once more. With *approvals*, a run that comes back paused (an OpenAI Agents SDK
        result with interruptions) is answered until it ends (:mod:`.openai_agents_pauses`). Its conversation."""
        from pytest_replaysafe.run.openai_agents_pauses import (
            answer_interruptions,
            contradict,
            is_paused,
            kept,
            takes_state,
        )

        answers = self._path(thread).with_suffix(".state")
        state = kept(answers) if input is None else None  # (a person's answer, sent again by the retried job)
        if state is not None and self.double_resume:
            contradict(lambda saved: self._call(thread, saved), answers, thread, self.log)
        if at_once is not None and input is None:
            at_once(lambda: self._call(thread, state))
        returned = self._call(thread, state)
        if is_paused(returned) and (approvals is None or not takes_state(self.loop)):
            raise pytest.UsageError(
                "crash_run.invoke: the OpenAI Agents SDK run paused for approval (its result has interruptions): "
                + ("request the approvals fixture in the test, and the harness answers it as a person would"
                   if approvals is None else "the run function must take state= (the answered RunState, saved "
                   "as a string) and resume from it: RunState.from_string(agent, state) (docs/openai-agents.md)")
            )  # fmt: skip
        if approvals is not None:
            answer_interruptions(returned, lambda saved: self._call(thread, saved), (thread, answers), approvals,
                                 self.log, at_once, self.double_resume)  # fmt: skip
        return self.result(thread)

    def _call(self, thread: str, state: str | None = None) -> object:
        """One call of the loop (with *state*: the answered pause it resumes from); its conversation saved. What
        it returned."""
        answer = {} if state is None else {"state": state}
        with in_loop(thread):  # (an effect its own code applies, outside a tool call, is on its thread)
            returned = self.loop(thread_id=thread, **answer, **self.input)
            if inspect.isawaitable(returned):
                returned = run_sync(_awaited(returned))
        conversation = returned
        if is_sdk_result(returned):  # an OpenAI Agents SDK run's result: its conversation read by the harness
            from tenxgraph.integrations.openai_agents import to_messages

            conversation = to_messages(returned)
        if not isinstance(conversation, list):
            raise pytest.UsageError(
                f"crash_run.invoke: the loop returned {type(returned).__name__}; a plain loop returns its "
                "conversation, a list of chat messages (dicts with role, content, tool_calls, tool_call_id), or "
                "of tenxgraph messages; a function that runs an OpenAI Agents SDK agent may return its result"
            )
        saved = [{TENXGRAPH: m.to_dict()} if isinstance(m, Message) else m for m in conversation]
        path = self._path(thread)
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        part.write_text(json.dumps(saved, default=str))
        os.replace(part, path)  # (atomic: a kill leaves the previous conversation or this one)
        return returned

    def _path(self, thread: str) -> Path:
        return self.workdir / f"{thread.replace(':', '_')}.loop.json"

    def result(self, thread: str) -> RunResult[Any]:
        """The thread's conversation as the loop last returned it, as tenxgraph messages."""
        path = self._path(thread)
        if not path.exists():
            raise RuntimeError(f"thread {thread!r}: the loop never returned a conversation")
        messages = [to_message(m, i) for i, m in enumerate(json.loads(path.read_text()))]
        return RunResult(thread, AgentState(messages=messages), 0)


async def _awaited(returned: Any) -> Any:
    return await returned


def to_message(chat: Mapping[str, Any], index: int) -> Message:
    """One chat message (the provider's format, with the loop's ``id`` and ``is_error``) as a tenxgraph message."""
    if TENXGRAPH in chat:
        return Message.from_dict(chat[TENXGRAPH])
    role, content = chat.get("role"), chat.get("content")
    text = content if isinstance(content, str) else ""
    if role == "assistant":
        calls = [
            ToolCallBlock(c["id"], c["function"]["name"], c["function"].get("arguments") or "{}")
            for c in chat.get("tool_calls") or ()
        ]
        if calls and not chat.get("id"):
            raise pytest.UsageError(
                f"crash_run.invoke: the loop's assistant message #{index} asks for tools but has no 'id': keep "
                "the id its calls were keyed by in the ledger beside the message (see docs/plain-loop.md)"
            )
        return Message.assistant(text, tool_calls=calls, message_id=chat.get("id") or f"loop-{index}")
    if role == "tool":
        result = ToolResultBlock(chat.get("tool_call_id"), content, bool(chat.get("is_error")))
        return Message.tool(result, message_id=f"loop-{index}")
    return Message.text_message(text, "system" if role in ("system", "developer") else "user",
                                message_id=f"loop-{index}")  # fmt: skip


def reachable_tools(loop: Any) -> Iterator[Any]:
    """The ledger ``Tool`` objects and OpenAI Agents SDK function tools *loop* can reach, each once (see the
    module's docstring)."""
    seen: set[int] = set()
    found: dict[int, Any] = {}

    def visit(obj: Any, depth: int) -> None:
        if id(obj) in seen or depth > _DEPTH or isinstance(obj, str | bytes | int | float | type):
            return
        seen.add(id(obj))
        if isinstance(obj, Tool) or is_function_tool(obj):
            found.setdefault(id(obj), obj)
            return
        for item in _parts(obj):
            visit(item, depth + 1)

    visit(loop, 0)
    yield from found.values()


def _parts(obj: Any) -> list[Any]:
    """What an object holds that may lead to a tool."""
    if isinstance(obj, Mapping):
        return list(obj.values())
    if isinstance(obj, list | tuple | set | frozenset):
        return list(obj)
    if isinstance(obj, functools.partial):
        return [obj.func, *obj.args, *obj.keywords.values()]
    if inspect.ismethod(obj):
        return [obj.__func__, obj.__self__]
    if inspect.isfunction(obj):
        code = obj.__code__
        cells = [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
        named = [obj.__globals__[n] for n in code.co_names if n in obj.__globals__]
        return [*cells, *(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values(), *named]
    if inspect.ismodule(obj):
        return []
    return list(vars(obj).values()) if hasattr(obj, "__dict__") else []


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True
