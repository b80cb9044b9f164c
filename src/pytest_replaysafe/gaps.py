"""The known gaps of replay safety, as data: where a duplicate execution is expected, and why.

A cell's duplicate is a *known gap* only if a rule here (or one added through the
``pytest_replaysafe_add_gaps`` hook) matches it; anything else is a violation. Point gaps are run as
``xfail(strict=True)``: a gap that stops duplicating turns the run red until this table is updated.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GapRule:
    """A duplicate is expected at ``point`` (a crash or fault point) or for calls with ``condition``."""

    name: str
    reason: str
    point: str | None = None
    condition: str | None = None
    modes: frozenset[str] | None = None  # None: every mode
    backends: frozenset[str] | None = None  # None: every backend

    def matches(self, point: str, condition: str | None, mode: str, backend: str) -> bool:
        if self.modes is not None and mode not in self.modes:
            return False
        if self.backends is not None and backend not in self.backends:
            return False
        if self.condition is not None:
            return condition == self.condition
        return condition is None and self.point == point


#: The condition of a call whose ledger write the store refused (logged by the harness's checkpointer wrapper).
RECORD_FAILED = "record_failed"

KNOWN_GAPS: tuple[GapRule, ...] = (
    GapRule(
        "in_flight",
        "the process died while the tool ran: its effect may be done, nothing was recorded",
        point="tool.in_flight",
    ),
    GapRule(
        "in_flight",
        "the process died while this call (for example a sibling of the crashed one) was still running",
        condition="in_flight",
    ),
    GapRule(
        "after_return",
        "the tool returned but the process died before its ledger record was written",
        point="tool.after_return",
    ),
    GapRule(
        "after_return",
        "this call (for example a sibling of the crashed one) had returned but was not recorded yet",
        condition="after_return",
    ),
    GapRule(
        "failed_record_write",
        "the record write failed: the call completed, was not recorded, and runs again",
        point="ledger.write_error",
    ),
    GapRule(
        "failed_ledger_read",
        "the ledger could not be read, so recorded calls run again (not running is worse)",
        point="ledger.read_error",
    ),
    GapRule(
        "failed_record_write",
        "the store refused this call's record write: it completed, was not recorded, and runs again",
        condition=RECORD_FAILED,
    ),
    GapRule("timeout", "a timed-out call is cancelled and not recorded; it runs again on replay", condition="timeout"),
    GapRule("missing_ids", "a call without message id or tool_call_id has no ledger key", condition="missing_id"),
)


def find_gap(rules: Iterable[GapRule], point: str, condition: str | None, mode: str, backend: str) -> GapRule | None:
    for rule in rules:
        if rule.matches(point, condition, mode, backend):
            return rule
    return None


def point_gap(rules: Iterable[GapRule], point: str, mode: str, backend: str) -> GapRule | None:
    """The gap a cell at *point* is expected to show for every protected call it crashes in, if any."""
    return find_gap(rules, point, None, mode, backend)


def gap_reasons(rules: Iterable[GapRule], point: str, names: str, mode: str, backend: str) -> dict[str, str]:
    """Why each gap a cell showed (``names``: comma-separated, as in the cell record) was expected: the point's
    own rule when it has that name, else the condition rule (a call left unfinished, a timeout, a missing id)."""
    rules = list(rules)
    own = point_gap(rules, point, mode, backend)
    reasons = {}
    for name in filter(None, names.split(",")):
        if own is not None and own.name == name:
            reasons[name] = own.reason
            continue
        for rule in rules:
            if rule.name == name and rule.condition is not None and rule.matches(point, rule.condition, mode, backend):
                reasons[name] = rule.reason
                break
    return reasons
