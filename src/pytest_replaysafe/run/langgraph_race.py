"""LangGraph's background-save race, played on purpose at ``langgraph.late_put_writes``.

LangGraph saves a task's writes in a background thread and does not wait for it before the next steps, with
``durability="sync"`` too (``sync`` waits for a step's checkpoint, not for its tasks' writes): a kill in that
thread can land while a later step's tool runs, its effect done and its ledger record not written. The harness's
saver fires ``langgraph.late_put_writes`` right after a task's writes are saved; :func:`late_kill` holds the kill
there until a later tool call has returned, and that call until the kill. Which saves a later call's return
followed is learned from the clean run (``PerProcessSaver.late_reach``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pytest_replaysafe.judge.evidence import call_id_of
from tenxgraph.core.tools.context import current_tool_call

#: Set while the kill at ``langgraph.late_put_writes`` is held (see :func:`late_kill`): the process still lives.
_late_holding = threading.Event()


def late_kill_held() -> bool:
    """The late point has fired and its kill is held: the process lives on (its saver still writes)."""
    return _late_holding.is_set()


#: How long the kill at ``langgraph.late_put_writes`` waits for a later tool call to return, in seconds.
LATE_HOLD_S = 20.0


def late_kill(
    crash: Callable[[str, int], None], window: dict[str, str], settle: Callable[[], None] | None = None
) -> Callable[[str, int], None]:
    """The action at ``langgraph.late_put_writes``: LangGraph's race, played on purpose. LangGraph saves a task's
    writes in a background thread, even with ``durability="sync"``, and goes on with the next steps; a kill in
    that thread can land while a later step's tool runs. Here the saving thread holds the kill (*crash*) until the
    next tool call has returned (``tool.after_return``: its effect done, its record not written), and that call
    holds until the kill, then dies with the process: the call is the cell's *window*."""
    from tenxgraph.core import crashpoints
    from tenxgraph.core.crashpoints import CrashInjected

    def fire(name: str, n: int) -> None:
        returned, killed = threading.Event(), threading.Event()
        _late_holding.set()  # (the point has fired; the process lives on until the kill)

        def at_return(point: str, arrival: int) -> None:
            call = current_tool_call()
            window.setdefault("id", call_id_of(call.message_id, call.index) if call else "*")
            if settle is not None:
                settle()
            returned.set()
            killed.wait(LATE_HOLD_S)
            raise CrashInjected(point, arrival)  # (in-process: this call dies with the process)

        crashpoints.arm("tool.after_return", 1, at_return)
        try:
            # No later call returned within the hold: on a loaded machine this save can come after the call the
            # clean run saw return later (the threads' race went the other way). The kill lands here all the
            # same, as a plain kill after the task's writes were saved (an error raised in LangGraph's saving
            # thread instead would fail the cell for the harness's timing, not the runtime's behaviour).
            if not returned.wait(LATE_HOLD_S):
                crashpoints.disarm("tool.after_return")
        finally:
            _late_holding.clear()
        try:
            crash(name, n)
        finally:
            killed.set()

    return fire
