"""The one seam through which anything outside the runtime watches or steers it (a server's metrics, the crash
matrix's harness): an :class:`Instrument` installed with :func:`install`.

An instrument has three optional hooks: ``on_event`` (every structured event of :mod:`tenxgraph.utils.events`,
whatever the log level), ``on_tool`` (every :class:`~tenxgraph.core.graph.utils.instrument.ToolEvent` of an
executed call) and ``completion_order`` (the order in which a batch's parallel calls may pass from their return to
their record; test harnesses only, and the first installed instrument that has one decides). Nothing installed,
each call site costs one check of an empty tuple. Crash points, the fault-injection side, are armed separately
(:mod:`tenxgraph.core.crashpoints`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

CompletionOrder = Callable[[list[Any]], Sequence[int | Sequence[int]]]
"""Given the calls (``ToolCallInfo``) of a batch that are about to run, the order in which they may pass from their
return to their record: their ``index`` values, each alone or in a group (a list) of calls that return at the same
moment and pass together, so that their records form one group commit."""


@dataclass(frozen=True, eq=False)
class Instrument:
    """What one observer wants to see or steer; a hook left None is not called."""

    on_event: Callable[[str, dict[str, Any]], None] | None = None
    on_tool: Callable[[Any], None] | None = None
    completion_order: CompletionOrder | None = None


_lock = threading.Lock()
#: The installed instruments (a tuple, replaced whole: readers need no lock).
installed: tuple[Instrument, ...] = ()


def install(instrument: Instrument) -> Callable[[], None]:
    """Install *instrument*; returns a function that removes it. Hooks must be quick."""
    global installed
    with _lock:
        installed = (*installed, instrument)

    def remove() -> None:
        global installed
        with _lock:
            installed = tuple(i for i in installed if i is not instrument)

    return remove


def completion_order() -> CompletionOrder | None:
    """The completion order of the first installed instrument that has one (None: calls pass as they come)."""
    return next((i.completion_order for i in installed if i.completion_order is not None), None)
