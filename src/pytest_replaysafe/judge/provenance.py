"""Provenance, the part of the verdict that compares answers: every tool result is what its own call's body
returned (value and error flag), every ledger record holds what its body returned (value, error flag, state
update) and was written after it returned, each call keeps one idempotency key across attempts, and no two calls
share one. Calls are identified by the harness (message and position), records by the runtime's key."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_replaysafe.judge.evidence import Entry, call_id_of, fingerprint

if TYPE_CHECKING:
    from tenxgraph.state.messages import Message


def provenance(
    messages: Sequence[Message], entries: list[Entry], labels: Mapping[str, str], tools: frozenset[str] | None
) -> list[str]:
    """Every tool result must be what its own call's body returned, its error flag included; every record written
    after that body returned, holding its value, error flag and state update; one idempotency key per call, and
    never one key for two calls. Calls are identified by the harness (message and position), records by the
    runtime's key, joined through the runtime's own events."""
    problems: list[str] = []
    returned: dict[str, set[Answer]] = defaultdict(set)  # call -> (fingerprint, is_error) its body returned
    returned_by_key: dict[str, set[Answer]] = defaultdict(set)  # runtime key -> the same
    updates_by_key: dict[str, set[str | None]] = defaultdict(set)  # runtime key -> the state updates it returned
    settled = {e.hid for e in entries if e.event == "in_doubt" and e.policy in ("fail", "reconcile")}
    settled_keys = {e.id for e in entries if e.event == "in_doubt" and e.policy in ("fail", "reconcile")}
    labels_by_key = {e.id: labels.get(e.hid, e.id) for e in entries if e.call is not None}
    keys = given_keys(entries)
    for e in entries:
        if e.event in ("end", "rejected"):  # (a rejected call's answer is its rejection, recorded like a result)
            returned[e.hid].add((e.fp, e.error))
            returned_by_key[e.id].add((e.fp, e.error))
            updates_by_key[e.id].add(e.ufp)
        elif e.event == "body_end" and e.fp is not None:  # what the witness saw the body return (the value a
            returned[e.hid].add((e.fp, e.error))  # framework shows the model, whatever envelope it records)
        elif e.event == "record" and e.id not in settled_keys:
            problems += _record_problem(e, returned_by_key, updates_by_key, labels_by_key.get(e.id, e.id))
    for call, ikeys in keys.items():
        if len(ikeys) > 1:
            problems.append(
                f"{labels.get(call, call)} was given {len(ikeys)} different idempotency keys across attempts"
            )
    problems += shared_keys(keys, labels)
    for call, given in deferred_answers(entries):  # (its result came from elsewhere: the answer is what it returned)
        returned[call].add((given, False))
    by_value = {fp: call for call, fps in returned.items() for fp, error in fps if fp is not None and not error}
    for i, m in enumerate(messages):
        if m.role != "assistant":
            continue
        occurrence: dict[str, int] = {}
        for index, asked in enumerate(m.tool_calls):
            occurrence[str(asked.id)] = occurrence.get(str(asked.id), 0) + 1
            hid = call_id_of(m.message_id, index)
            if asked.id is None or hid in settled or (tools is not None and asked.name not in tools):
                continue
            result = result_of(messages, i, str(asked.id), occurrence[str(asked.id)])
            if result is None:
                continue  # a lost result is reported by result_problems
            label = labels.get(hid, hid)
            if hid not in returned:
                if not result.is_error:  # (an error: the runtime's own answer, such as unknown tool or timeout)
                    problems.append(f"{label} was answered with a result although its body never ran")
                continue
            answer = (fingerprint(result.output), bool(result.is_error))
            if answer in returned[hid] or (answer[1] and any(fp is None for fp, _ in returned[hid])):
                continue  # its own answer (or the error result of a value no backend could store)
            if (answer[0], not answer[1]) in returned[hid]:
                said, did = ("a failure", "succeeded") if answer[1] else ("a success", "failed")
                problems.append(f"{label} was answered as {said} although its body {did} (error flag not replayed)")
                continue
            other = by_value.get(answer[0]) if answer[0] is not None else None
            source = f"the result of {labels.get(other, other)}" if other else "a value its body never returned"
            problems.append(f"{label} was answered with {source}")
    return problems


def deferred_answers(entries: Iterable[Entry]) -> list[tuple[str, str | None]]:
    """The answers to a Pydantic AI agent's calls deferred as external (``CallDeferred``: asked as a question, its
    body paused): each call (harness identity) with its answer's fingerprint, recorded or given."""
    deferred = {e.id: e.hid for e in entries if e.event == "asked" and e.cond == "interrupt" and e.call
                and e.via == "pydantic_ai"}  # fmt: skip
    return [(deferred[e.id], e.fp) for e in entries if e.event in ("decided", "answered") and e.id in deferred]


Answer = tuple[str | None, bool]
"""What a body returned, as the verdict compares it: the output's fingerprint and the error flag."""


def _record_problem(
    e: Entry, returned: Mapping[str, set[Answer]], updates: Mapping[str, set[str | None]], label: str
) -> list[str]:
    """A ledger record must come after its body returned and hold what it returned (value, error flag, update)."""
    if e.id not in returned:
        return [f"the ledger record of {label} was written before its body returned"]
    answers = returned[e.id]
    if any(fp is None for fp, _ in answers) and e.error:
        return []  # a value no backend can store: its error result is recorded instead
    if (e.fp, e.error) not in answers:
        if (e.fp, not e.error) in answers:
            return [f"the ledger record of {label} flips its error flag (is_error={e.error} for a body that did not)"]
        return [f"the ledger record of {label} holds a value its body never returned"]
    if e.ufp is not None and None not in updates.get(e.id, {None}) and e.ufp not in updates[e.id]:
        return [f"the ledger record of {label} holds a state update its body never returned"]
    return []


def given_keys(entries: Iterable[Entry]) -> dict[str, set[str]]:
    """Call -> the idempotency keys its body was given (across attempts), as the runtime reported them and as the
    harness's witness saw the body receive them."""
    keys: dict[str, set[str]] = defaultdict(set)
    for e in entries:
        if e.event in ("start", "body") and e.ikey:
            keys[e.hid].add(e.ikey)
    return keys


def shared_keys(
    keys: Mapping[str, set[str]], labels: Mapping[str, str], sent: str = "were given the same idempotency key"
) -> list[str]:
    """Distinct calls must get distinct idempotency keys: a provider drops every call after the first that shares
    one (a key derived without the message id repeats ``call_1`` of every turn). *keys*: call -> the keys it was
    given (or, with *sent* saying so, sent to the provider)."""
    owners: dict[str, set[str]] = defaultdict(set)
    for call, ikeys in keys.items():
        for ikey in ikeys:
            owners[ikey].add(call)
    problems = []
    for ikey, calls in sorted(owners.items()):
        if len(calls) > 1:
            names = " and ".join(labels.get(c, c) for c in sorted(calls))
            problems.append(
                f"{names} {sent} {ikey!r}: a provider would drop all but the first as "
                "a duplicate (the key must differ for every call: thread, message id and tool_call_id)"
            )
    return problems


def result_of(messages: Sequence[Message], index: int, call_id: str, occurrence: int) -> Any:
    """The *occurrence*-th result for *call_id* among the tool messages after ``messages[index]``."""
    seen = 0
    for m in messages[index + 1 :]:
        if m.role != "tool":
            break
        for r in m.tool_results:
            if str(r.call_id) == call_id:
                seen += 1
                if seen == occurrence:
                    return r
    return None


def answer_to(messages: Sequence[Message], hid: str) -> Any:
    """The result block answering the call whose harness identity is *hid* (``call_id_of``), or None."""
    for i, m in enumerate(messages):
        ids = [str(c.id) for c in m.tool_calls] if m.role == "assistant" else []
        for index, call_id in enumerate(ids):
            if call_id_of(m.message_id, index) == hid:
                return result_of(messages, i, call_id, ids[: index + 1].count(call_id))
    return None
