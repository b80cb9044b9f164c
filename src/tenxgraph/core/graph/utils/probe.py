"""The one object through which a test harness reaches a tool call outside the ledger's own steps: a crash point
fired from an integration's code, and the completion order of a message's calls that a framework hands over one
by one. In production it does nothing: a disarmed crash point costs one global check, and with no instrument
installed there is no order (:meth:`Probe.turns` is None).

An integration (``tenxgraph.ledger.probe``) calls it and names no harness type: what it gets back from
:meth:`Probe.turns` is opaque, handed to the ledger as ``turns=``, and asked only whether it is still
:attr:`~tenxgraph.core.graph.utils.instrument.BatchTurns.ended` or :attr:`~...BatchTurns.complete`."""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from tenxgraph.core.crashpoints import crash_point as fire
from tenxgraph.core.graph.utils.instrument import BatchTurns, batch_turns
from tenxgraph.core.tools.context import ToolCallInfo
from tenxgraph.utils import instrument

__all__ = ["Probe", "probe"]


class Probe:
    """What a harness may watch or steer in an integration's call path (see the module's docstring)."""

    def point(self, name: str) -> None:
        """Fire crash point *name* (a declared one: ``tenxgraph.core.crashpoints.POINTS``) if a harness armed it."""
        fire(name)  # (the call sites, probe.point("..."), name the point: tests/test_crashpoints.py)

    def __init__(self) -> None:
        self._live: weakref.WeakSet[BatchTurns] = weakref.WeakSet()  # the orders it made, while held

    def ordered(self) -> bool:
        """Whether a harness orders the returns of parallel calls now."""
        return instrument.completion_order() is not None

    def turns(self, calls: Sequence[ToolCallInfo], patience: float) -> BatchTurns | None:
        """The completion order of a message's *calls* handed over one by one (each waits at most *patience*
        seconds for a sibling to come in), or None: no harness orders them, or there is one call."""
        turns = batch_turns(list(calls), patience=patience)
        if turns is not None:
            self._live.add(turns)
        return turns

    def crashed(self, crash: BaseException) -> None:
        """The harness's run crashed in this process, as if the process died: every order still under way ends
        with *crash* (its calls still waiting raise it), so that a resume on the same event loop makes orders of
        its own instead of joining one whose calls will never finish."""
        for turns in list(self._live):
            turns.abandon(crash)


#: The probe every integration uses.
probe = Probe()
