"""The one place a crash-matrix cell's verdict is decided, from everything the cell observed.

A hit is judged against the clean run of the same test: the same conversation (roles and tool calls), the same
final answer, no tool called more often than there, every tool result answered by its own call's execution,
every ledger record written after its body returned and holding what the body returned, one idempotency key per
call, and no effect applied more often than in the clean run. A duplicate execution is a known gap only where the
gap table expects one; anything else is a violation.

(Past the ~350-line guide on purpose: the verdict is decided in one place, and its rules read top to bottom here;
what it draws on is in evidence, gaps, provenance and outcome.)
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_replaysafe.judge.evidence import UNRECORDED, Entry, body_runs, call_id_of, preview
from pytest_replaysafe.judge.gaps import RECORD_FAILED, UNRECORDED_WHY, GapRule, find_gap
from pytest_replaysafe.judge.outcome import Outcome
from pytest_replaysafe.judge.pauses import pause_problems
from pytest_replaysafe.judge.provenance import answer_to, given_keys, provenance, shared_keys
from pytest_replaysafe.judge.witnessed import effect_and_policy, witness_problems

if TYPE_CHECKING:
    from tenxgraph.state.messages import Message

#: The marks of a call unprotected by its nature: it timed out, its model gave it no id, no ledger recorded it.
UNPROTECTED = frozenset({"timeout", "missing_id", UNRECORDED})
#: Why a call no ledger recorded ran once per resumer, by framework (a LangGraph app's: below).
RESUMERS_WHY = {
    "pydantic_ai": " (no ledger recorded it: each resumer ran it; with pydantic_ai.LedgerDurability it runs once)",
    "openai_agents": " (no ledger recorded it: each resumer ran it; replay_safe and run_replay_safe run it once)",
}
#: Points that fire while tool calls are in progress: only there may a sibling legitimately be unfinished at the
#: crash (running, or returned and not recorded yet). At every other point the node had completed or not
#: started, so an unrecorded call that ran again is a violation, not a gap.
TOOL_WINDOW_POINTS = frozenset(
    {
        "tool.before_ledger_read",
        "tool.before_invoke",
        "tool.in_flight",
        "tool.after_return",
        "tool.after_record",
        "ledger.write_error",
        "ledger.read_error",
        # a LangGraph saver's writes: with durability="async" a step's checkpoint is saved while the next step's
        # tools run, so these fire with calls in flight too
        "langgraph.after_put_writes",
        "langgraph.before_put",
        "langgraph.after_put",
        "langgraph.late_put_writes",
    }
)


#: Why a LangGraph model turn runs again after a crash, and the fix.
LANGGRAPH_ASKED_AGAIN = (
    " (LangGraph: the AIMessage that asked for it was not saved before its tools ran, as with durability='async',"
    " LangGraph's default; the model was asked again and its new message has new ids: invoke with "
    "durability='sync')"
)


#: Why a Pydantic AI model turn runs again after a crash, and the fix.
PYDANTIC_AI_ASKED_AGAIN = (
    " (Pydantic AI: the response that asked for it was not kept before its tools ran; LedgerDurability journals "
    "each model response and a resumed run is answered from the journal)"
)


def _asked_again(durability: str) -> str:
    """Why a LangGraph model turn ran again, and the fix: durability='sync', unless the run already has it."""
    if not durability:
        return ""
    if durability == "sync":
        return (
            " (LangGraph, durability='sync' already: the AIMessage that asked for it was not in a saved checkpoint "
            "when the crash came)"
        )
    return LANGGRAPH_ASKED_AGAIN


@dataclass(frozen=True, slots=True)
class Reference:
    """What the clean run of the same test did."""

    shape: list[str]
    final_text: str
    calls_per_tool: Counter[str]
    outside_effects: Counter[tuple[str, str]]  # (node, kind) of effects applied outside any tool


@dataclass
class HitEvidence:
    crashed: bool
    window: str | None  # execution id of the call in the crash window; "*" = any call of the re-run node
    entries: list[Entry]  # the execution log of the hit's thread, crash run and resume
    unfinished: dict[str, str]  # calls left in_flight / after_return at the crash
    final_messages: Sequence[Message] | None = None
    final_text: str | None = None
    resume_error: str | None = None
    error: str | None = None
    effects: list[dict[str, Any]] | None = None  # effects applied on the hit's thread (None: no simulator)
    contest: list[str] = field(default_factory=list)  # problems the concurrent resumers found
    tools: frozenset[str] | None = None  # the marker's tools=: only their calls are judged
    #: A resume that stopped by design instead of running calls in doubt, and was resumed again (its reason).
    stopped: str | None = None
    #: Set by the verdict: a call ran again as its effect class allows (a ``read``), so no gap had to show.
    excused: bool = False
    #: Crashes during the recovery (depth 2): (point, window, calls unfinished at it that the resume had run).
    later: list[tuple[str, str | None, dict[str, str]]] = field(default_factory=list)
    #: Set by the verdict: calls settled in doubt without a re-run whose effect never happened (``effects`` saw
    #: none): the model was told of a doubt, nothing was done.
    not_applied: list[str] = field(default_factory=list)
    #: A LangGraph app's durability ("" for ours): the verdict's explanations name LangGraph's causes and fixes.
    langgraph: str = ""
    #: What the app is built with (its marker's ``framework``): the explanations name that framework's fix.
    framework: str = "tenxgraph"

    def executions(self) -> Counter[str]:
        """Body executions per call (the harness's call identity; a run that paused for a person is not one)."""
        return body_runs(self.entries)


def shape(messages: Sequence[Message]) -> list[str]:
    """A conversation as roles and tool calls, without ids or texts: what a repeated turn changes."""
    out = []
    for m in messages:
        calls = ",".join(c.name for c in m.tool_calls) if m.role == "assistant" else ""
        out.append(f"{m.role}({calls})" if calls else m.role)
    return out


def reference(
    messages: Sequence[Message], final_text: str, entries: list[Entry], effects: list[dict[str, Any]] | None
) -> Reference:
    return Reference(shape(messages), final_text, _calls_per_tool(entries), _outside_effects(effects or []))


def _calls_per_tool(entries: Iterable[Entry]) -> Counter[str]:
    calls: dict[str, str] = {}
    for e in entries:
        if e.event in ("start", "body") and e.tool is not None:
            calls[e.hid] = e.tool
    return Counter(calls.values())


def _outside_effects(effects: Iterable[Mapping[str, Any]]) -> Counter[tuple[str, str]]:
    return Counter((str(e.get("node")), str(e["kind"])) for e in effects if e.get("execution_id") is None)


def call_labels(messages: Sequence[Message]) -> dict[str, str]:
    """Call id (``call_id_of``) -> ``tool(args)`` for every call in a conversation, for messages a person can act
    on."""
    labels = {}
    for m in messages:
        for index, call in enumerate(m.tool_calls):
            raw = call.args
            args = ", ".join(f"{k}={v!r}" for k, v in sorted(raw.items())) if isinstance(raw, dict) else repr(raw)
            labels[call_id_of(m.message_id, index)] = f"{call.name}({args})"
    return labels


def result_problems(messages: Sequence[Message]) -> list[str]:
    """Every tool call must have exactly one result, right after its assistant message; no stray results."""
    problems: list[str] = []
    i = 0
    while i < len(messages):
        message = messages[i]
        i += 1
        if message.role == "tool":
            ids = [r.call_id for r in message.tool_results]
            problems.append(f"tool result(s) {ids} do not follow an assistant message asking for them")
            continue
        if message.role != "assistant" or not message.tool_calls:
            continue
        asked = Counter(str(c.id) for c in message.tool_calls)
        got: Counter[str] = Counter()
        while i < len(messages) and messages[i].role == "tool":
            got.update(str(r.call_id) for r in messages[i].tool_results)
            i += 1
        if asked != got:
            lost, extra = sorted((asked - got).elements()), sorted((got - asked).elements())
            problems.append(f"assistant message {message.message_id}: lost results for {lost}, extra results {extra}")
    return problems


def _effect_problems(evidence: HitEvidence, ref: Reference, labels: Mapping[str, str]) -> list[str]:
    """*labels*: runtime key -> ``tool(args)`` (the simulator stores the runtime's execution id)."""
    if evidence.effects is None:
        return []
    problems = []
    for (node, kind), n in sorted(_outside_effects(evidence.effects).items()):
        clean = ref.outside_effects.get((node, kind), 0)
        if n > clean:
            fix = "make the effect a tool call, which the ledger protects"
            if evidence.framework == "loop":  # (a plain loop's calls: docs/plain-loop.md)
                fix = "run the loop's calls through tenxgraph.ledger.invoke_tool_calls (docs/plain-loop.md)"
            problems.append(
                f"effect {kind!r} was applied {n} times by node {node!r} outside any tool (clean run: {clean}): "
                f"code outside tools is re-run on resume; {fix}"
            )
    ikeys: dict[str, set[str]] = defaultdict(set)
    for e in evidence.effects:
        if e.get("execution_id") and e.get("idempotency_key"):
            ikeys[e["execution_id"]].add(e["idempotency_key"])
    for eid, found in sorted(ikeys.items()):
        if len(found) > 1:
            problems.append(f"{labels.get(eid, eid)} sent {len(found)} different idempotency keys to the provider")
    return problems + shared_keys(ikeys, labels, sent="sent the provider the same idempotency key")


def clean_run_problems(messages: Sequence[Message], entries: list[Entry]) -> list[str]:
    """What is wrong with a run that did not crash (a plain test run, no matrix): lost or extra results, keys shared
    by two calls, a body run twice, and what the witness saw the runtime get wrong."""
    labels = call_labels(messages)
    problems = result_problems(messages) + shared_keys(given_keys(entries), labels)
    problems += [f"{labels.get(c, c)} executed {n} times in a run without crash" for c, n in body_runs(entries).items()
                 if n > 1]  # fmt: skip
    return problems + witness_problems(messages, entries, labels)


def judge(
    evidence: HitEvidence, ref: Reference, rules: Iterable[GapRule], point: str, mode: str, backend: str
) -> tuple[Outcome, str | None, str]:
    """``(outcome, gap names, detail)`` for one hit."""
    rules = list(rules)
    if evidence.error:
        return Outcome.ERROR, None, evidence.error
    if not evidence.crashed:
        return Outcome.VACUOUS, None, f"the run finished without reaching {point} at this hit"
    if evidence.resume_error:
        return Outcome.RESUME_FAILED, None, f"resume failed: {evidence.resume_error}"
    messages = list(evidence.final_messages or [])
    labels = call_labels(messages)
    problems = list(evidence.contest) + result_problems(messages)
    if evidence.final_text != ref.final_text:
        problems.append(f"final answer {evidence.final_text!r} differs from the clean run's {ref.final_text!r}")
    got = shape(messages)
    if got != ref.shape:
        problems.append(f"the conversation differs from the clean run's: {' '.join(got)} vs {' '.join(ref.shape)}")
    for tool, n in sorted(_calls_per_tool(evidence.entries).items()):
        if n > ref.calls_per_tool.get(tool, 0):
            problems.append(
                f"{tool} was called for {n} distinct calls, {ref.calls_per_tool.get(tool, 0)} in the clean run: "
                "a model turn ran again and asked for it anew"
                + _asked_again(evidence.langgraph)
                + (PYDANTIC_AI_ASKED_AGAIN if evidence.framework == "pydantic_ai" else "")
            )
    problems += provenance(messages, evidence.entries, labels, evidence.tools)
    problems += pause_problems(evidence.entries, labels)
    problems += witness_problems(messages, evidence.entries, labels)
    problems += _effect_problems(evidence, ref, {e.id: labels.get(e.hid, e.id) for e in evidence.entries})
    crashes = [(point, evidence.window, evidence.unfinished), *evidence.later]
    calls_of = {e.id: e.call for e in evidence.entries if e.call is not None}  # records carry only the key
    # a call of a tool with an in-doubt policy runs again only after a resume found it in doubt (retry, or a
    # reconcile that found nothing), never silently: not after a crash, not after a refused record write
    declared = effect_and_policy(evidence.entries)  # the tool's declaration where the witness saw its body
    policed = {hid for hid, (_, policy) in declared.items() if policy}
    refused = Counter(calls_of.get(e.id, e.id) for e in evidence.entries if e.cond == RECORD_FAILED)
    refused = Counter({call: n for call, n in refused.items() if call not in policed})
    # timeout, missing id, no ledger: unprotected by their nature (not a pause's marks: a call that waited for a
    # person is held to its declaration like any other)
    marked = {e.hid: e.cond for e in evidence.entries if e.cond in UNPROTECTED}
    gaps: set[str] = set()
    reads = {hid for hid, (effect, _) in declared.items() if effect == "read"}  # may run again: no gap, no record
    # a transactional call's writes commit with its record: what counts is how often that committed
    transactional = {hid for hid, (effect, _) in declared.items() if effect == "transactional"}
    commits = Counter(calls_of.get(e.id, e.id) for e in evidence.entries if e.event == "recorded")
    applied = Counter(calls_of.get(str(f.get("execution_id")), "") for f in evidence.effects or [])
    exactly_once: list[str] = []
    if transactional and (evidence.window in ("*", None) or evidence.window in transactional):
        evidence.excused = True  # a transactional call closes the point's gap: it need not show
    doubted = Counter(e.hid for e in evidence.entries if e.event == "in_doubt")
    for eid, n in sorted(evidence.executions().items()):
        if n > 1 and eid in reads:
            evidence.excused = True
        if n > 1 and eid in transactional:
            problem, once = _transactional(labels.get(eid, eid), n, commits[eid], applied[eid])
            problems += problem
            exactly_once += once
            continue
        if n < 2 or eid in reads:
            continue
        allowed, names = _allowance(eid, crashes, marked.get(eid), rules, mode, backend, refused[eid])
        if eid in policed and marked.get(eid) is None and n > 1 + doubted[eid]:
            problems.append(
                f"{labels.get(eid, eid)} executed {n} times, {n - 1 - doubted[eid]} of them again without in-doubt "
                "detection although its tool has an in-doubt policy (was its intent written?)"
            )
            continue
        if n <= allowed:
            gaps |= names
            continue
        if marked.get(eid) == UNRECORDED and mode == "resumers" and evidence.framework in RESUMERS_WHY:
            why = RESUMERS_WHY[evidence.framework]
        elif marked.get(eid) == UNRECORDED and mode == "resumers":
            why = (
                " (no ledger recorded it: each process that resumed the pause ran it; ReplaySafeToolNode runs it "
                "once, and tenxgraph.integrations.langgraph.resume_once the rest of the thread)"
            )
        elif marked.get(eid) == UNRECORDED:
            why = UNRECORDED_WHY.get(evidence.framework, UNRECORDED_WHY["langgraph"])
        elif names:
            why = f" (its crashes allow {int(allowed)}: one run more per crash that left it unfinished)"
        elif evidence.window == eid and evidence.unfinished.get(eid) == "after_return":
            why = f" (the crash at {point} hit it after its record was said to be written, yet no record was)"
        elif eid in evidence.unfinished:
            why = f" (it was {evidence.unfinished[eid]} at a crash outside the tool path)"
        elif mode == "prune" and commits[eid] > 1:  # (recorded before the kill, and again after the resume)
            why = (
                " (its record, written before the kill, was gone at the resume: the retention job ran between them, "
                "and a thread that can still be resumed, or that the store cannot see finished, keeps its records)"
            )
        else:
            why = ""
        problems.append(f"{labels.get(eid, eid)} executed {n} times{why}")
    if problems:
        return Outcome.VIOLATION, None, "; ".join(problems)
    if gaps:
        return Outcome.KNOWN_GAP, ",".join(sorted(gaps)), _gap_detail(evidence, gaps, labels)
    if exactly_once:
        evidence.excused = True
        detail = "; ".join(exactly_once) + " (the attempts a crash cut short were rolled back with their record)"
        return Outcome.EXACTLY_ONCE, None, detail
    if evidence.stopped:
        return (
            Outcome.IN_DOUBT_HANDLED,
            None,
            f"the resume stopped instead of running calls in doubt, and was resumed again: {evidence.stopped}",
        )
    handled = {e.hid for e in evidence.entries if e.event == "in_doubt" and e.policy in ("fail", "reconcile")}
    if handled and (evidence.window is None or evidence.window in ({"*"} | handled)):  # (None: a storage fault)
        what = "; ".join(_settled(evidence, eid, labels, messages) for eid in sorted(handled))
        return (
            Outcome.IN_DOUBT_HANDLED,
            None,
            f"the call in the crash window was in doubt and settled without a re-run: {what}",
        )
    return Outcome.PROTECTED, None, "every recorded call executed at most once, answered with its own result"


def _settled(evidence: HitEvidence, eid: str, labels: Mapping[str, str], messages: Sequence[Message]) -> str:
    """What happened to a call a resume found in doubt: whether its body had run, whether its effect was applied
    (where the test's ``effects`` saw it), and what the model was shown instead of a second run."""
    label = labels.get(eid, eid)
    policy = next(e.policy for e in evidence.entries if e.hid == eid and e.event == "in_doubt")
    runs = sum(1 for e in evidence.entries if e.hid == eid and e.event == "start")
    ran = "its body had not started" if runs == 0 else f"its body had run {'once' if runs == 1 else f'{runs} times'}"
    applied = None
    if evidence.effects is not None:
        ids = {e.id for e in evidence.entries if e.hid == eid}
        applied = sum(1 for f in evidence.effects if f.get("execution_id") in ids)
        ran += (
            f", and its effect was applied {applied} time{'s' if applied != 1 else ''}"
            if applied
            else ", so nothing was applied (no effect of it happened)"
        )
    shown = answer_to(messages, eid)
    told = (
        "no result" if shown is None else f"{'an error' if shown.is_error else 'the result'} {preview(shown.output)!r}"
    )
    said = f"{label} (on_in_doubt={policy!r}): {ran}; the model was shown {told}"
    if applied == 0:
        evidence.not_applied.append(label)
    if applied == 0 and shown is not None and shown.is_error and evidence.final_text:
        said += (
            f"; the final answer was {evidence.final_text!r} all the same: check that it does not claim what was "
            "not done (a real model should report the doubt)"
        )
    return said


def _transactional(label: str, runs: int, commits: int, applied: int) -> tuple[list[str], list[str]]:
    """A transactional call that ran *runs* times: ``(problems, exactly-once notes)``. Its writes must have
    committed once, with its record (the harness sees the record, and the effect where ``effects.apply_in``
    recorded it)."""
    if commits > 1:
        return [f"{label} committed its writes {commits} times"], []
    if applied > 1:
        return [
            f"{label} ran {runs} times and its effect was applied {applied} times: its writes did not commit with "
            "its ledger record"
        ], []
    checked = (
        "" if applied else " (seen by its record; record its effect with effects.apply_in(tx, ...) to have it checked)"
    )
    return [], [f"{label} ran {runs} times, its writes committed once{checked}"]


def _allowance(
    eid: str,
    crashes: list[tuple[str, str | None, dict[str, str]]],
    marked: str | None,
    rules: list[GapRule],
    mode: str,
    backend: str,
    refused: int = 0,
) -> tuple[float, set[str]]:
    """How often call *eid* may execute, and the gaps that allow it: once, plus once per crash whose window held
    it (the point's own gap) or that left it unfinished in the tool path (a sibling's gap), plus once per record
    write of it the store refused; a call unprotected by its nature (timed out, no id) re-runs on every attempt."""
    allowed: float = 1
    names: set[str] = set()
    rule = find_gap(rules, crashes[0][0], RECORD_FAILED, mode, backend) if refused else None
    if rule is not None:
        allowed += refused
        names.add(rule.name)
    for point, window, unfinished in crashes:
        rule = find_gap(rules, point, None, mode, backend) if window in ("*", eid) else None
        # the crash hit this very call: the point says where it was (after its record, at tool.after_record), not
        # the log; a call the log shows unrecorded there lost a record it was said to have
        condition = unfinished.get(eid) if point in TOOL_WINDOW_POINTS and window != eid else None
        if condition == "after_return" and marked == UNRECORDED:  # returned, and no ledger would ever record it
            condition = None
        if rule is None and condition is not None:
            rule = find_gap(rules, point, condition, mode, backend)
        if rule is not None:
            allowed += 1
            names.add(rule.name)
    rule = find_gap(rules, crashes[0][0], marked, mode, backend) if marked else None
    if rule is not None:
        allowed = float("inf")
        names = names or {rule.name}
    return allowed, names


def _gap_detail(evidence: HitEvidence, gaps: set[str], labels: Mapping[str, str]) -> str:
    twice = [eid for eid, n in sorted(evidence.executions().items()) if n > 1]
    detail = f"ran again where the gap table expects it ({', '.join(sorted(gaps))}): "
    detail += ", ".join(labels.get(eid, eid) for eid in twice)
    return detail + "".join(_answered_differently(evidence.entries, eid) for eid in twice)


def _answered_differently(entries: Iterable[Entry], eid: str) -> str:
    """The consequence a re-run can have although the gap is documented: a tool that checks state (an order no
    longer pending, a ticket already open) refuses its own second run, and the model is shown that instead."""
    ends = [e for e in entries if e.event == "end" and e.hid == eid]
    if len(ends) < 2 or len({(e.fp, e.error) for e in ends}) == 1:
        return ""
    first, last = ends[0], ends[-1]
    return (
        f"; its runs answered differently: first {first.answer()}, then {last.answer()}, and the model was shown "
        "the last (a tool that checks state refuses its own second run)"
    )
