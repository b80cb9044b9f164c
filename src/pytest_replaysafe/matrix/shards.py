"""``--crash-shard=K/N``: one deterministic plan of the collected items, split into N disjoint shards.

Every machine that collects the same tests with the same crash options and seed computes the same plan, and
keeps only its own shard (the others' items are reported as deselected). The plan:

- groups the items: a crash-matrix test's items on one backend form one group (they share that backend's
  set-up: a schema, a pool), any other test is a group of its own; a group bigger than half a shard's share is
  cut into consecutive pieces, so that one large test cannot unbalance the shards;
- costs each item: its cells' ``duration_s`` summed from an earlier report (``--crash-shard-costs``, a whole or
  merged ``--crash-report``), an item the report does not have costing the median of those it has; without a
  report every item costs 1;
- deals the groups out largest first, each to the shard with the least cost so far (ties: the lowest K);
- names itself with a digest of the seed, the crash options, N and every item's shard, which each shard's
  report carries: ``python -m pytest_replaysafe merge`` refuses shards of different plans.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_replaysafe.matrix import report_file

SHARD_OPTION = "--crash-shard"
_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


class ShardError(ValueError):
    """A shard option or costs report that cannot be used (the message names it and the fix)."""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1 to ``count``) of ``count``."""

    index: int
    count: int

    @classmethod
    def parse(cls, raw: str) -> Shard:
        found = _SHARD.match(raw)
        if found is None:
            raise ShardError(
                f"{SHARD_OPTION}={raw!r}: give K/N, shard K of N counted from 1, such as 2/4 (in a Kubernetes "
                "Indexed Job: $((JOB_COMPLETION_INDEX + 1))/N)"
            )
        index, count = int(found.group(1)), int(found.group(2))
        if count < 1 or not 1 <= index <= count:
            raise ShardError(f"{SHARD_OPTION}={raw!r}: K must be 1 to N and N at least 1 (shards are counted from 1)")
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass(frozen=True)
class Item:
    """What the plan needs of one collected item: its id and its group (test function, and backend for a cell)."""

    nodeid: str
    group: str


@dataclass
class Plan:
    """One shard's part of the plan, as its report carries it (``shard`` in the JSON report)."""

    shard: Shard
    digest: str
    #: Items in the whole plan (every shard's), and this shard's, in collection order.
    total: int
    items: list[str] = field(default_factory=list)
    #: Where the costs came from (a report's path), or None: every item cost 1.
    costs: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.shard.index,
            "count": self.shard.count,
            "plan": self.digest,
            "total": self.total,
            "items": self.items,
            "costs": self.costs,
        }


def group_of(nodeid: str, backend: str | None) -> str:
    """``path::test[point-backend-mode]`` on backend ``b`` -> ``path::test @ b``; other tests: their own id."""
    return f"{nodeid.split('[')[0]} @ {backend}" if backend else nodeid


def read_costs(path: Path) -> dict[str, float]:
    """Seconds per item (its cells' ``duration_s`` summed) from an earlier ``--crash-report``."""
    try:
        data = report_file.read(path)
    except report_file.ReportFileError as exc:
        raise ShardError(f"--crash-shard-costs={path}: {exc}; give an earlier run's --crash-report JSON") from exc
    costs: dict[str, float] = {}
    for cell in data["cells"]:
        costs[str(cell["test"])] = costs.get(str(cell["test"]), 0.0) + float(cell.get("duration_s") or 0.0)
    return costs


def _pieces(members: Sequence[tuple[str, float]], most: float) -> list[list[tuple[str, float]]]:
    """Consecutive pieces of a group, each costing about *most* at most (a piece has one item at least)."""
    pieces: list[list[tuple[str, float]]] = [[]]
    spent = 0.0
    for member in members:
        if pieces[-1] and spent + member[1] > most:
            pieces.append([])
            spent = 0.0
        pieces[-1].append(member)
        spent += member[1]
    return pieces


def assign(items: Sequence[Item], count: int, costs: Mapping[str, float] | None = None) -> dict[str, int]:
    """Each item's shard (1 to *count*): groups kept whole up to half a shard's share, dealt largest first to the
    shard with the least cost so far. The same *items* and *costs* give the same answer on every machine, in
    whatever order they were collected."""
    known = [c for c in (costs or {}).values() if c > 0]
    fallback = statistics.median(known) if known else 1.0
    groups: dict[str, list[tuple[str, float]]] = {}
    for item in sorted(items, key=lambda i: (i.group, i.nodeid)):  # (not the collection's order: a plugin may shuffle)
        cost = (costs or {}).get(item.nodeid) or fallback
        groups.setdefault(item.group, []).append((item.nodeid, cost))
    share = sum(c for members in groups.values() for _, c in members) / count
    pieces = [
        (name, n, piece)
        for name, members in groups.items()
        for n, piece in enumerate(_pieces(members, max(share / 2, 1e-9)))
    ]
    pieces.sort(key=lambda p: (-sum(c for _, c in p[2]), p[0], p[1]))
    load = [0.0] * count
    shard_of: dict[str, int] = {}
    for _, _, piece in pieces:
        k = min(range(count), key=lambda i: (load[i], i))
        load[k] += sum(c for _, c in piece)
        for nodeid, _ in piece:
            shard_of[nodeid] = k + 1
    return shard_of


def digest(options: Mapping[str, Any], count: int, shard_of: Mapping[str, int]) -> str:
    """The plan's name: the crash options (seed included), N and every item's shard."""
    text = json.dumps({"options": options, "count": count, "items": sorted(shard_of.items())}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan(
    items: Sequence[Item],
    shard: Shard,
    options: Mapping[str, Any],
    costs: tuple[str, Mapping[str, float]] | None = None,
) -> Plan:
    """This shard's part of the plan over *items* (ids must be unique, as pytest's are)."""
    shard_of = assign(items, shard.count, costs[1] if costs else None)
    mine = [item.nodeid for item in items if shard_of[item.nodeid] == shard.index]
    return Plan(shard, digest(options, shard.count, shard_of), len(items), mine, costs[0] if costs else None)


class Selector:
    """The pytest side, registered with ``--crash-shard``: after every other selection (``-k``, ``-m``,
    ``--crash-replay``), keep this shard's items. The plan goes to the reporter through ``config.stash`` (or, on an
    xdist worker, its ``workeroutput``: the controller does not collect)."""

    def __init__(self, shard: Shard, options: Mapping[str, Any], costs_path: Path | None) -> None:
        self.shard = shard
        self.options = options
        self.costs_path = costs_path
        self.plan: Plan | None = None

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        costs = (str(self.costs_path), read_costs(self.costs_path)) if self.costs_path else None
        found = [Item(item.nodeid, group_of(item.nodeid, _backend(item))) for item in items]
        self.plan = plan(found, self.shard, self.options, costs)
        mine = set(self.plan.items)
        dropped = [item for item in items if item.nodeid not in mine]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.nodeid in mine]
        workeroutput = getattr(config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[WORKER_KEY] = self.plan.to_json()


WORKER_KEY = "replaysafe_shard"


def _backend(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    cell = callspec.params.get("_replaysafe_cell") if callspec is not None else None
    return getattr(cell, "backend", None)
