"""What the harness saw for itself, against what the runtime said: the part of the verdict that does not take the
runtime's word.

The harness's witness (:mod:`pytest_replaysafe.run.witness`) writes, from inside each tool body, the tool's
declaration (effect class, the in-doubt policy it puts in force), the idempotency key the body received, and the
body's own outcome (``body``, ``body_end``, ``body_paused`` events). The rules here compare those facts with the
runtime's events for the same call (the harness's call identity, message and position):

- the runtime must handle a call as its tool declares: the effect class and in-doubt policy on the runtime's events
  are the declaration's (a runtime that drops a policy, or takes a write for a read, re-runs it unseen);
- a call whose body failed (raised, or returned an error ``ToolOutput``) is never answered as a success;
- every key a body received is one the runtime reported for that call (the key the provider deduplicates on is
  the body's, not the runtime's account of it), and an MCP request carries the reported key in its ``_meta``.

Elsewhere the verdict counts a call's runs by the larger of the two accounts
(:func:`pytest_replaysafe.judge.evidence.body_runs`), and decides which calls may simply run again (a declared
``read``), which are transactional and which have an in-doubt policy from the declaration (:func:`declared`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pytest_replaysafe.judge.evidence import UNDECLARED, Entry
from pytest_replaysafe.judge.provenance import answer_to

if TYPE_CHECKING:
    from tenxgraph.state.messages import Message

#: The runtime's own events about a call (its ``ToolCallInfo`` carries the effect class and policy it applied).
RUNTIME_EVENTS = ("start", "end", "timeout", "in_doubt", "paused")

Declaration = tuple[str | None, str | None]
"""A tool's effect class and the in-doubt policy its declaration puts in force."""


def declared(entries: Sequence[Entry]) -> dict[str, Declaration]:
    """Call -> its tool's declaration as the witness saw it (calls whose body ran under the witness, less LangGraph
    tools in a node whose declarations it could not read)."""
    return {e.hid: (e.effect, e.policy) for e in entries if e.event == "body" and e.via != UNDECLARED}


def effect_and_policy(entries: Sequence[Entry]) -> dict[str, Declaration]:
    """Call -> the effect class and in-doubt policy the verdict judges it by: its declaration where the witness
    saw its body, else what the runtime's events say (a call replayed or settled without running)."""
    said = {e.hid: (e.effect, e.policy) for e in entries if e.event in RUNTIME_EVENTS}
    return {**said, **declared(entries)}


def witness_problems(messages: Sequence[Message], entries: Sequence[Entry], labels: Mapping[str, str]) -> list[str]:
    """Where the runtime's account of a call differs from what its tool declares or its body did."""
    problems: list[str] = []
    declarations = declared(entries)
    handled: dict[str, set[Declaration]] = defaultdict(set)
    reported: dict[str, set[str | None]] = defaultdict(set)
    received: dict[str, set[str]] = defaultdict(set)
    outcomes: dict[str, set[bool]] = defaultdict(set)
    settled: set[str] = set()
    unkeyed: set[str] = set()
    for e in entries:
        if e.event in RUNTIME_EVENTS and e.call is not None:
            handled[e.hid].add((e.effect, e.policy))
        if e.event == "start":
            reported[e.hid].add(e.ikey)
        elif e.event == "body" and e.ikey:
            received[e.hid].add(e.ikey)
        elif e.event == "body" and e.via == "mcp":
            unkeyed.add(e.hid)  # the request reached its server without a key in _meta
        elif e.event == "body_end":
            outcomes[e.hid].add(e.error)
        if e.event == "in_doubt" or e.cond == "timeout":
            settled.add(e.hid)  # answered by the runtime instead of by a body's return
    for hid, (effect, policy) in sorted(declarations.items()):
        label = labels.get(hid, hid)
        for got in sorted(handled.get(hid, set()) - {(effect, policy)}, key=str):
            problems.append(
                f"{label}: its tool declares {_say(effect, policy)}, yet the runtime handled the call as "
                f"{_say(*got)} (a policy or effect class the runtime drops is a re-run nobody sees)"
            )
    for hid, keys in sorted(received.items()):
        unreported = keys - reported.get(hid, keys)  # (a run the runtime did not report: counted elsewhere)
        if unreported:
            problems.append(
                f"{labels.get(hid, hid)}'s body was given an idempotency key the runtime did not report "
                f"({', '.join(sorted(unreported))}; reported: {', '.join(sorted(map(str, reported[hid])))}): the "
                "provider deduplicates on the key the body sends"
            )
    for hid in sorted(unkeyed):
        said = sorted(k for k in reported.get(hid, set()) if k)
        if said:
            problems.append(
                f"{labels.get(hid, hid)} reached its MCP server without the idempotency key the runtime reported "
                f"({', '.join(said)}) in the request's _meta: the server cannot deduplicate a re-run"
            )
    for hid, errors in sorted(outcomes.items()):
        if errors != {True} or hid in settled:
            continue
        result = answer_to(messages, hid)
        if result is not None and not result.is_error:
            problems.append(
                f"{labels.get(hid, hid)} was answered as a success although its body raised (or returned an "
                "error), as the harness saw it from inside the body"
            )
    return problems


def _say(effect: str | None, policy: str | None) -> str:
    return f"effect {effect or 'none'} with in-doubt policy {policy or 'none'}"
