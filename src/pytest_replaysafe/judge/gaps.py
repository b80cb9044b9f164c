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
    #: What closes the gap for the user's tool (named in a failure of the test's own assertions at it).
    remedy: str = ""

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

#: Where the gaps and their remedies are documented (named in every failure at a gap).
GAPS_DOC = "docs/replay-safe-tools.md#what-it-does-not-guarantee"

#: A crash cut the call short after its effect: the four ways to close that, weakest first.
_CRASH_REMEDY = (
    "have the provider deduplicate it (declare an `idempotency_key: str` parameter, pass it on, and mark the tool "
    '`@tool(effect="idempotent")`), or detect the call in doubt on resume (`@tool(effect="external", '
    'on_in_doubt="reconcile", reconcile=...)` returns the first outcome; `on_in_doubt="fail"` refuses to guess), '
    'or make the effect a write in the checkpointer\'s database (`@tool(effect="transactional")`: exactly once)'
)
_POLICY_REMEDY = (
    'give the tool an in-doubt policy (`@tool(on_in_doubt="reconcile", reconcile=...)` or `on_in_doubt="fail"`): '
    "its intent record is found on resume and the call is not run blind; or an idempotency key the provider honours"
)

#: The same fixes in LangGraph's terms (a LangGraph tool is declared to ``ReplaySafeToolNode``, not with ``@tool``).
_LANGGRAPH_TERMS = (
    (
        'mark the tool `@tool(effect="idempotent")`',
        'declare it `ReplaySafeToolNode(tools, ledger=..., effects={name: "idempotent"})`',
    ),
    (
        '`@tool(effect="external", on_in_doubt="reconcile", reconcile=...)`',
        '`ReplaySafeToolNode(..., on_in_doubt={name: "reconcile"}, reconcile={name: fn})`',
    ),
    ('`@tool(on_in_doubt="reconcile", reconcile=...)`', '`ReplaySafeToolNode(..., on_in_doubt={name: "reconcile"})`'),
    ("declare an `idempotency_key: str` parameter, pass it on", "pass `current_idempotency_key()` to the provider"),
    (
        ', or make the effect a write in the checkpointer\'s database (`@tool(effect="transactional")`: exactly once)',
        "",
    ),
)


#: The same fixes in Pydantic AI's terms (a tool is declared to the agent's ``LedgerDurability``, as to the node).
_PYDANTIC_AI_TERMS = tuple(
    (ours, theirs.replace("ReplaySafeToolNode(tools, ledger=...", "LedgerDurability(ledger").replace(
        "ReplaySafeToolNode(", "LedgerDurability("))
    for ours, theirs in _LANGGRAPH_TERMS
)  # fmt: skip


#: Why a call no ledger recorded ran again, in the words of the framework a bare test runs (its fix named).
UNRECORDED_WHY = {
    "langgraph": (
        " (no ledger recorded it when it returned: LangGraph's ToolNode runs the whole batch again, finished calls "
        "included; tenxgraph.integrations.langgraph.ReplaySafeToolNode records each call as it returns)"
    ),
    "pydantic_ai": (
        " (no ledger recorded it when it returned: a bare Pydantic AI agent run again on its saved history runs "
        "the calls its last response asked for again, finished ones included; "
        "tenxgraph.integrations.pydantic_ai.LedgerDurability records each call as it returns)"
    ),
    "openai_agents": (
        " (no ledger recorded it when it returned: the SDK alone runs the crashed turn's calls again, finished "
        "ones included; tenxgraph.integrations.openai_agents.replay_safe records each call as it returns)"
    ),
}


def remedies_of(rules: Iterable[GapRule], framework: str) -> str:
    """The remedies of *rules*, once each, in the test's framework's terms."""
    said = "; ".join(dict.fromkeys(rule.remedy for rule in rules if rule.remedy))
    if framework == "pydantic_ai":
        return in_terms(said, _PYDANTIC_AI_TERMS)
    return in_langgraph_terms(said) if framework == "langgraph" else said


def in_langgraph_terms(remedy: str) -> str:
    """A remedy told to a LangGraph test: the same fix, declared the way a LangGraph tool is."""
    return in_terms(remedy, _LANGGRAPH_TERMS)


def in_terms(remedy: str, terms: Iterable[tuple[str, str]]) -> str:
    """*remedy* with each of our runtime's spellings replaced by the framework's (*terms*)."""
    for ours, theirs in terms:
        remedy = remedy.replace(ours, theirs)
    return remedy


KNOWN_GAPS: tuple[GapRule, ...] = (
    GapRule(
        "in_flight",
        "the process died while the tool ran: its effect may be done, nothing was recorded",
        point="tool.in_flight",
        remedy=_CRASH_REMEDY,
    ),
    GapRule(
        "in_flight",
        "the process died while this call (for example a sibling of the crashed one) was still running",
        condition="in_flight",
        remedy=_CRASH_REMEDY,
    ),
    GapRule(
        "after_return",
        "the tool returned but the process died before its ledger record was written",
        point="tool.after_return",
        remedy=_CRASH_REMEDY,
    ),
    GapRule(
        "after_return",
        "LangGraph saves a task's writes in a background thread while later steps run (durability='sync' too): "
        "the kill in that thread landed after this later call returned, before its ledger record was written",
        point="langgraph.late_put_writes",
        remedy=_CRASH_REMEDY,
    ),
    GapRule(
        "after_return",
        "this call (for example a sibling of the crashed one) had returned but was not recorded yet",
        condition="after_return",
        remedy=_CRASH_REMEDY,
    ),
    GapRule(
        "failed_record_write",
        "the record write failed: the call completed, was not recorded, and runs again",
        point="ledger.write_error",
        remedy=_POLICY_REMEDY,
    ),
    GapRule(
        "failed_ledger_read",
        "the ledger could not be read, so recorded calls run again (not running is worse)",
        point="ledger.read_error",
        remedy='give the tool an in-doubt policy (`on_in_doubt="fail"` or `"reconcile"`): the run then stops '
        "(LedgerReadError, resumable) instead of running its calls unprotected",
    ),
    GapRule(
        "failed_record_write",
        "the store refused this call's record write: it completed, was not recorded, and runs again",
        condition=RECORD_FAILED,
        remedy=_POLICY_REMEDY,
    ),
    GapRule(
        "timeout",
        "a timed-out call is cancelled and not recorded; it runs again on replay",
        condition="timeout",
        remedy="raise the run's `tool_timeout` above the tool's latency, or give the tool an in-doubt policy (its "
        "intent is written before the call)",
    ),
    GapRule(
        "missing_ids",
        "a call without message id or tool_call_id has no ledger key",
        condition="missing_id",
        remedy="give every assistant message an id and every tool call a `tool_call_id` (your model adapter)",
    ),
)


def find_gap(rules: Iterable[GapRule], point: str, condition: str | None, mode: str, backend: str) -> GapRule | None:
    for rule in rules:
        if rule.matches(point, condition, mode, backend):
            return rule
    return None


def point_gap(rules: Iterable[GapRule], point: str, mode: str, backend: str) -> GapRule | None:
    """The gap a cell at *point* is expected to show for every protected call it crashes in, if any."""
    return find_gap(rules, point, None, mode, backend)


def shown_rules(rules: Iterable[GapRule], point: str, names: str, mode: str, backend: str) -> dict[str, GapRule]:
    """The rule behind each gap a cell showed (``names``: comma-separated, as in the cell record): the point's own
    rule when it has that name, else the condition rule (a call left unfinished, a timeout, a missing id)."""
    rules = list(rules)
    own = point_gap(rules, point, mode, backend)
    shown = {}
    for name in filter(None, names.split(",")):
        if own is not None and own.name == name:
            shown[name] = own
            continue
        for rule in rules:
            if rule.name == name and rule.condition is not None and rule.matches(point, rule.condition, mode, backend):
                shown[name] = rule
                break
    return shown


def gap_reasons(rules: Iterable[GapRule], point: str, names: str, mode: str, backend: str) -> dict[str, str]:
    """Why each gap a cell showed was expected (the rules' reasons; see :func:`shown_rules`)."""
    return {name: rule.reason for name, rule in shown_rules(rules, point, names, mode, backend).items()}
