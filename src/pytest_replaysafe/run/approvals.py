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
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tenxgraph.core.tools.interrupts import Interrupt
    from tenxgraph.state.messages import JSON

#: How many pauses one drive may answer before the harness calls it a loop (a run that pauses for ever).
MAX_ROUNDS = 50


class Approvals:
    """Answers every pause of a run driven through ``crash_run``: approve everything (the default), or as
    :meth:`answer` says. ``asked`` lists the interrupts it was asked in this process, in order."""

    def __init__(self, workdir: Path) -> None:
        self.path = workdir / "resumes.jsonl"
        self._rule: Callable[[Interrupt], JSON] = lambda interrupt: True
        self.asked: list[Interrupt] = []

    def answer(self, rule: Callable[[Interrupt], Any] | bool | str) -> None:
        """How to answer: a function of the :class:`~tenxgraph.Interrupt` (``lambda i: i.args["amount"] < 500``,
        or any JSON value for an ``interrupt()`` question), or one value for every interrupt (``True`` approves,
        ``False`` or a reason string rejects)."""
        self._rule = rule if callable(rule) else (lambda interrupt: rule)

    def decide(self, interrupt: Interrupt) -> JSON:
        self.asked.append(interrupt)
        return self._rule(interrupt)

    def sent(self, thread: str, decisions: dict[str, JSON]) -> None:
        """Keep the Resume sent on *thread* (one ``write(2)``: it survives a kill of this process)."""
        line = json.dumps({"thread": thread, "decisions": decisions}) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def last_sent(self, thread: str) -> dict[str, JSON] | None:
        """The decisions of the last Resume sent on *thread* (in any process of the cell), or None."""
        if not self.path.exists():
            return None
        last = None
        for line in self.path.read_text().splitlines():
            row = json.loads(line)
            if row["thread"] == thread:
                last = row["decisions"]
        return last
