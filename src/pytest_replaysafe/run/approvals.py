"""The ``approvals`` fixture: the person the harness plays. A run driven through ``crash_run`` that pauses for a
person (an approval, ``interrupt()``) is answered by it with ``Resume`` until it ends, so that a test's approval
flow is crashed and resumed like any tool call: at the pause, at the decision, and in the approved call.

What it asked and answered goes to the cell's execution log (``asked`` by the harness when a run comes back
paused; ``decided`` by the harness's checkpointer wrapper when a decision is written), for the verdict
(:mod:`pytest_replaysafe.judge.pauses`). The Resumes it sent are kept in a file of the cell, so that a resume in
another process can send the last one again (the ``double-resume`` mode: a double click, a retried request)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_replaysafe.judge.evidence import Entry, ExecutionLog, call_id_of, fingerprint, preview
from tenxgraph.core.tools.interrupts import Resume
from tenxgraph.state.messages import Message, ToolResultBlock

if TYPE_CHECKING:
    from tenxgraph.core.graph.compiled import CompiledGraph, RunResult
    from tenxgraph.core.tools.interrupts import Interrupt
    from tenxgraph.state.messages import JSON

#: How a Resume is sent by many processes at once: ``at_once(send)`` (:func:`.resumers.send_at_once`).
AtOnce = Callable[[Callable[[], object]], None]
#: How many pauses one drive may answer before the harness calls it a loop (a run that pauses for ever).
MAX_ROUNDS = 50


class Approvals:
    """Answers every pause of a run driven through ``crash_run``: approve everything (the default), or as
    :meth:`answer` says. :meth:`asked` lists what it was asked on a thread, by every process of the cell."""

    def __init__(self, workdir: Path) -> None:
        self.path = workdir / "resumes.jsonl"
        self._rule: Callable[[Interrupt], JSON] = lambda interrupt: True

    def answer(self, rule: Callable[[Interrupt], Any] | bool | str) -> None:
        """How to answer: a function of the :class:`~tenxgraph.Interrupt` (``lambda i: i.args["amount"] < 500``,
        or any JSON value for an ``interrupt()`` question), or one value for every interrupt (``True`` approves,
        ``False`` or a reason string rejects)."""
        self._rule = rule if callable(rule) else (lambda interrupt: rule)

    def asked(self, thread_id: str) -> list[Interrupt]:
        """The interrupts this person was shown on *thread_id* (``crash_run.thread_id``), in order, by every process
        of the cell: a person asked twice for one thing shows here twice."""
        from tenxgraph.core.tools.interrupts import Interrupt

        return [Interrupt.from_dict(i) for row in self._rows(thread_id) for i in row["asked"]]

    def decide(self, interrupt: Interrupt) -> JSON:
        """The person's answer to *interrupt*, as :meth:`answer` said."""
        answer: JSON = self._rule(interrupt)
        return answer

    def ask(
        self,
        thread: str,
        asked: Sequence[tuple[Interrupt, str | None]],
        log: ExecutionLog,
        via: str | None = None,
        bare: bool = False,
    ) -> dict[str, JSON]:
        """Show the person a pause's interrupts (each with the harness's identity of its call): what was asked is
        logged (``asked``, *via* the framework's harness) and kept with the answers (:meth:`keep`); for a *bare*
        agent (no ledger records them), what the person said is logged as given (``answered``). The decisions,
        by interrupt id."""
        for interrupt, call in asked:
            log.write(Entry(thread, interrupt.id, "asked", interrupt.tool, call=call, cond=interrupt.kind,
                            out=preview(interrupt.value), via=via))  # fmt: skip
        decisions = {interrupt.id: self.decide(interrupt) for interrupt, _ in asked}
        self.keep(thread, [interrupt for interrupt, _ in asked], decisions)
        if bare:  # (no ledger records them: what the person said stands for the decision)
            for interrupt_id, decision in decisions.items():
                log.write(Entry(thread, interrupt_id, "answered", fp=fingerprint(decision), out=preview(decision),
                                t=round(time.monotonic(), 6), via=via))  # fmt: skip
        return decisions

    def _rows(self, thread: str) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [row for row in map(json.loads, self.path.read_text().splitlines()) if row["thread"] == thread]

    def keep(self, thread: str, asked: list[Interrupt], decisions: dict[str, JSON]) -> None:
        """Keep what was asked on *thread* and the Resume sent (one ``write(2)``: it survives a kill of this
        process)."""
        row = {"thread": thread, "asked": [i.to_dict() for i in asked], "decisions": decisions}
        line = json.dumps(row) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def retried(self, thread: str) -> list[Resume]:
        """The last Resume sent on *thread* (in any process of the cell), to send again, if there was one."""
        if not self.path.exists():
            return []
        sent = [
            row["decisions"] for row in map(json.loads, self.path.read_text().splitlines()) if row["thread"] == thread
        ]
        return [Resume(sent[-1])] if sent else []

    def resend(
        self, graph: CompiledGraph[Any], thread: str, cfg: dict[str, Any], log: ExecutionLog, contradict: bool
    ) -> list[Resume]:
        """The last Resume sent on *thread*, to send again (:meth:`retried`); *contradict* (``double-resume``):
        first a *different* decision for each of its interrupts (a second person, a stale tab), which must be
        refused (an error that says so) and change nothing: one decision per interrupt, ever; a runtime that takes
        the second acts on an answer the person never gave. Only decisions the harness saw written are contradicted
        (one the crash cut before its record is not decided yet)."""
        from tenxgraph.utils.errors import ConfigError

        last = self.retried(thread)
        if not last or not contradict:
            return last
        decided = {e.id for e in log.entries(thread) if e.event == "decided"}  # (seen written: the harness's own)
        other = {i: v is not True for i, v in last[0].decisions.items() if i in decided}  # (True -> False; else True)
        if not other:  # nothing recorded yet: a different answer would be the first one
            return last
        before = graph.checkpointer.get_thread(thread)
        try:
            graph.invoke(Resume(other), cfg)
        except ConfigError:  # refused, as it must be; whatever else went wrong is the run's own failure
            after = graph.checkpointer.get_thread(thread)
            if (before and before.version) != (after and after.version):
                log.write(Entry(thread, "resume", "pause_problem", out=(
                    "a refused Resume with a different decision wrote the thread (version "
                    f"{before and before.version}, then {after and after.version}): a refusal must change nothing"
                )))  # fmt: skip
            return last
        log.write(Entry(thread, "resume", "pause_problem", out=(
            f"a Resume with a different decision ({other}) after the recorded one ({last[0].decisions}) was "
            "accepted: one decision per interrupt, a second different one must be refused"
        )))  # fmt: skip
        return last

    def settle(
        self,
        graph: CompiledGraph[Any],
        result: RunResult[Any],
        cfg: dict[str, Any],
        stream: bool,
        log: ExecutionLog,
        twice: bool,
        at_once: AtOnce | None = None,
    ) -> RunResult[Any]:
        """Answer a run that paused, and every pause after it, until the run ends; what was asked goes to *log*.
        *twice*: send every Resume a second time (``double-resume``): it must change nothing. *at_once*
        (``resumers``): how to send each Resume from many processes at once, before the harness's own."""
        thread = cfg["thread_id"]
        for _ in range(MAX_ROUNDS):
            if result.status != "interrupted":
                return result
            if not result.interrupts:
                raise RuntimeError(f"thread {thread!r} paused (status interrupted) but lists no interrupt to answer")
            decisions = self.ask(thread, [(i, call_of(result, i)) for i in result.interrupts], log)
            if at_once is not None:  # (``resumers``: the same Resume from k processes at once first)
                at_once(partial(run_once, graph, Resume(decisions), cfg, stream))
            answered = run_once(graph, Resume(decisions), cfg, stream)
            if twice:  # a double click: the same answers again must change nothing
                again = run_once(graph, Resume(decisions), cfg, stream)
                if (again.status, again.version) != (answered.status, answered.version):
                    problem = (
                        f"the same Resume sent twice wrote the thread again (status {answered.status!r} version "
                        f"{answered.version}, then {again.status!r} version {again.version}): a repeated decision "
                        "must be answered as the thread stands"
                    )
                    log.write(Entry(thread, "resume", "pause_problem", out=problem))
            result = answered
        raise RuntimeError(f"thread {thread!r} paused {MAX_ROUNDS} times in one drive: a pause that never ends?")


def run_once(
    graph: CompiledGraph[Any], input: Mapping[str, Any] | Resume | None, cfg: dict[str, Any], stream: bool
) -> RunResult[Any]:
    """One run of *graph*: ``invoke``, or ``stream`` to its end with the modes a chat UI uses (model tokens and
    tool results as they happen, node updates, the result). Streamed, it checks the stream's promise: every tool
    result a node stores was streamed before that node's update, marked replayed exactly when it was."""
    if not stream:
        return graph.invoke(input, cfg)
    result: RunResult[Any] | None = None
    streamed: dict[str, tuple[bool, tuple[bool, ...]]] = {}  # tool result message id -> (replayed, error flags)
    for mode, chunk in graph.stream(input, cfg, stream_mode=["updates", "messages", "result"]):
        if mode == "result":
            result = chunk
        elif mode == "messages" and isinstance(chunk[0], Message) and chunk[0].role == "tool":
            streamed[chunk[0].message_id] = (bool(chunk[1].get("replayed")), _errors(chunk[0]))
        elif mode == "updates":
            for update in chunk.values():
                for message in update.get("messages", ()):
                    if message.role == "tool":
                        _check_streamed(message, streamed.get(message.message_id))
    assert result is not None
    return result


def _errors(message: Message) -> tuple[bool, ...]:
    return tuple(b.is_error for b in message.content if isinstance(b, ToolResultBlock))


def _check_streamed(message: Message, streamed: tuple[bool, tuple[bool, ...]] | None) -> None:
    """A tool result a node stored was streamed before its update, marked replayed exactly when it was, and
    an error exactly when it is one (a UI must not show a failed refund as done)."""
    stored = bool(message.metadata.get("replayed"))
    said = None
    if streamed is None:
        said = "was not streamed"
    elif streamed[0] != stored:
        said = f"was streamed as replayed={streamed[0]}"
    elif streamed[1] != _errors(message):
        said = f"was streamed with error flags {list(streamed[1])}, stored with {list(_errors(message))}"
    if said is not None:
        raise AssertionError(
            f"stream_mode='messages' misreported tool result {message.message_id!r}: its node stored it as "
            f"replayed={stored}, and it {said} before the node's update"
        )


def call_of(result: RunResult[Any], interrupt: Interrupt) -> str | None:
    """The harness's identity of the call an interrupt is about (its message and position), if it is a call's."""
    for message in result.messages:
        if message.message_id == interrupt.message_id:
            for index, call in enumerate(message.tool_calls):
                if call.id == interrupt.call_id:
                    return call_id_of(message.message_id, index)
    return None
