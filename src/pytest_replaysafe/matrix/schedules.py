"""Crashes during recovery: ``--crash-depth=2`` (or ``@pytest.mark.crash_matrix(depth=2)``).

A depth-2 schedule crashes at (the cell's point, hit i), resumes, crashes *again* at (point B, hit j) of that
resume, and resumes a second time; the verdict covers the whole schedule (:func:`pytest_replaysafe.judge.verdict.judge`
allows each call one extra execution per crash that left it unfinished, no more).

Which second crashes exist is learned, not guessed: the depth-1 resume of hit i counts every crash point it
passes (``crashpoints.counting``), so (B, j) is a candidate for each crash-kind point B and each j up to B's count.
The candidates of one test item are enumerated when they fit ``--crash-budget`` (default :data:`DEFAULT_BUDGET`
schedules per item; ``all``: no limit). Otherwise the *replay path* is always run, every candidate whose second
crash is the first arrival of a :data:`REPLAY_PATH` point in the resume (the node being recovered reads its ledger,
replays recorded results, settles in-doubt calls and completes there), and the rest of the budget is drawn by
seed. ``--crash-then=B@j`` runs that second crash only (the repro line of one schedule).

Depth 2 applies to the ``inprocess``, ``stream`` and ``sigkill`` modes (in ``sigkill`` both crashes are real kill
-9s of different processes) and to crash-kind first points; a fault point's own recovery step is already the
resume's first read or write.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from pytest_replaysafe.matrix.cells import DEFAULT_BUDGET
from pytest_replaysafe.matrix.orders import Orders

#: Where the resume recovers: its first arrival at each of these is always among the second crashes run.
REPLAY_PATH = ("tool.before_ledger_read", "tool.after_record", "node.after_complete", "run.after_advance")
#: Points that are never a second crash: ``langgraph.late_put_writes`` holds its kill for a later tool call's
#: return, which only the clean run tells it will come (a first crash's hits are learned there).
FIRST_ONLY = frozenset({"langgraph.late_put_writes"})
#: Modes a depth-2 schedule runs in (``concurrent`` resumes through a contest of its own).
DEPTH_MODES = frozenset({"inprocess", "stream", "sigkill"})


@dataclass(frozen=True, order=True, slots=True)
class SecondCrash:
    """The second crash of a schedule: at *point*, its *hit*-th arrival during the first resume."""

    point: str
    hit: int

    def __str__(self) -> str:
        return f"{self.point}@{self.hit}"

    @classmethod
    def parse(cls, text: str, option: str = "--crash-then") -> SecondCrash:
        import pytest

        point, sep, hit = text.strip().rpartition("@")
        if not sep or not point or not hit.isdigit() or int(hit) < 1:
            raise pytest.UsageError(
                f"replaysafe: {option}={text!r}: give a crash point and its hit in the resume, such as "
                "tool.before_ledger_read@1"
            )
        return cls(point, int(hit))


#: One execution of a test body: its first crash's hit, completion order, and second crash (None: depth 1).
Plan = tuple[int, int, SecondCrash | None]


@dataclass(frozen=True)
class Depth:
    depth: int = 1
    budget: int | None = DEFAULT_BUDGET  # None: every candidate
    then: SecondCrash | None = None  # --crash-then: this second crash only

    @classmethod
    def parse(cls, depth: object, budget: object, then: str | None) -> Depth:
        from pytest_replaysafe.matrix.cells import parse_number

        parsed_depth = 1 if depth in (None, "") else parse_number(depth, "--crash-depth", 1, "1 or 2")
        if parsed_depth > 2:
            import pytest

            raise pytest.UsageError(f"replaysafe: --crash-depth={depth!r}: depth 1 and 2 are supported; give 1 or 2")
        limit: int | None = DEFAULT_BUDGET
        if budget is not None and str(budget).strip().lower() == "all":
            limit = None
        elif budget not in (None, ""):
            limit = parse_number(budget, "--crash-budget", 0, "a number of schedules per test (0 or more) or 'all'")
        chosen = SecondCrash.parse(then) if then else None
        return cls(2 if chosen else parsed_depth, limit, chosen)

    def flag(self, then: SecondCrash | None) -> str:
        """What a repro line adds to run the schedule with second crash *then* again."""
        return f" --crash-depth=2 --crash-then={then}" if then is not None else ""


@dataclass
class Choice:
    """The depth-2 schedules chosen for one test item, and how (for the report)."""

    plans: list[Plan]
    candidates: int
    enumerated: int  # run because they fit the budget, or lie on the replay path
    sampled: int  # drawn by seed from the rest
    shrunk: int = 0  # smaller schedules run after one failed (see :func:`smaller`)


def candidates(first: list[tuple[int, int]], counts: Mapping[tuple[int, int], Mapping[str, int]]) -> list[Plan]:
    """Every (hit, order, second crash) whose second crash the depth-1 resume of (hit, order) reached."""
    from tenxgraph.core.crashpoints import get_crash_point

    out: list[Plan] = []
    for hit, order in first:
        for point, n in sorted(counts.get((hit, order), {}).items()):
            if get_crash_point(point).kind == "crash" and point not in FIRST_ONLY:
                out += [(hit, order, SecondCrash(point, j)) for j in range(1, n + 1)]
    return out


#: At most this many smaller schedules are tried per test item after a failing one.
SHRINK_LIMIT = 8


def size(plan: Plan) -> tuple[int, int, int, str]:
    """Smaller is: an earlier first hit, then the default order, then an earlier second hit."""
    hit, order, then = plan
    return (hit, order, then.hit if then else 0, then.point if then else "")


def smaller(plan: Plan, counts: Mapping[tuple[int, int], Mapping[str, int]]) -> list[Plan]:
    """Schedules one step smaller than a failing *plan*, smallest first: the same second crash at an earlier
    first hit or in the default order, or an earlier arrival of the second point (where that resume reached it)."""
    hit, order, then = plan
    assert then is not None
    steps: list[Plan] = [(h, order, then) for h in range(1, hit)]
    steps += [(hit, 0, then)] if order else []
    steps += [(hit, order, SecondCrash(then.point, j)) for j in range(1, then.hit)]
    reached = [p for p in steps if p[2] is not None and counts.get((p[0], p[1]), {}).get(p[2].point, 0) >= p[2].hit]
    return sorted(reached, key=size)


def choose(all_plans: list[Plan], depth: Depth, rng: random.Random) -> Choice:
    if depth.then is not None:
        plans = [p for p in all_plans if p[2] == depth.then]
        return Choice(plans, len(all_plans), len(plans), 0)
    if depth.budget is None or len(all_plans) <= depth.budget:
        return Choice(list(all_plans), len(all_plans), len(all_plans), 0)
    always = [p for p in all_plans if p[2] is not None and p[2].hit == 1 and p[2].point in REPLAY_PATH]
    rest = [p for p in all_plans if p not in always]
    drawn = rng.sample(rest, max(0, min(len(rest), depth.budget - len(always))))
    chosen = sorted(always + drawn, key=lambda p: (p[0], p[1], str(p[2])))
    return Choice(chosen, len(all_plans), len(always), len(drawn))


#: The user property a matrix item reports its depth-2 choice under (summed by the reporter).
SCHEDULES_PROPERTY = "replaysafe_schedules"


def totals(samples: list[dict[str, int]]) -> dict[str, int]:
    """The depth-2 choices of every item, summed: ``items``, ``candidates``, ``enumerated``, ``sampled``."""
    keys = ("candidates", "enumerated", "sampled")
    out = {"items": len(samples), **{k: sum(s.get(k, 0) for s in samples) for k in (*keys, "shrunk")}}
    out["budget"] = max((s.get("budget", -1) for s in samples), default=-1)
    return out


def summary_line(t: dict[str, int]) -> str:
    """One closing line: how many depth-2 schedules ran, how many were enumerated and how many drawn by seed."""
    run = t["enumerated"] + t["sampled"]
    budget = "all" if t["budget"] < 0 else str(t["budget"])
    shrunk = f", {t['shrunk']} smaller ones tried after a failure" if t.get("shrunk") else ""
    return (
        f"depth 2: {run} schedules of {t['candidates']} possible in {t['items']} items ({t['enumerated']} "
        f"enumerated, {t['sampled']} sampled by seed{shrunk}; --crash-budget={budget} per item)"
    )


@dataclass
class Planner:
    """Which executions of a test body follow the first: every depth-1 hit and completion order; then, once their
    resumes ran (and counted the points they reached), the depth-2 schedules chosen under the budget; then, after
    a failing one, smaller ones (:func:`smaller`), each chosen once the last verdict is in."""

    seed: int
    nodeid: str
    hits: set[int] | None
    orders: Orders
    depth: Depth
    #: Per (hit, order): how often the depth-1 resume reached each point (the candidates for a second crash).
    resume_counts: dict[tuple[int, int], dict[str, int]] = field(default_factory=dict)
    choice: Choice | None = None  # the depth-2 schedules chosen, and how
    widest: int = 0  # the widest parallel batch of a clean run

    def plans(
        self, reached: int, current: tuple[int, int], second_crashes: bool, failing: Callable[[], list[Plan]]
    ) -> Iterator[Plan]:
        """*reached*: the most hits of the point in a clean run; *current*: the first execution's (hit, order);
        *second_crashes*: depth 2 applies to this cell; *failing*: the depth-2 schedules that failed so far."""
        wanted = sorted(self.hits) if self.hits else list(range(1, reached + 1))
        first = [(h, o) for h in wanted if h <= reached for o in self.orders.variants(self.widest)]
        yield from [(h, o, None) for h, o in first if (h, o) != current]
        if self.depth.depth < 2 or not second_crashes:
            return
        rng = random.Random(f"{self.seed}:{self.nodeid}:depth2")
        self.choice = choose(candidates(first, self.resume_counts), self.depth, rng)
        yield from self.choice.plans
        if self.depth.then is None:
            yield from self.shrink(set(self.choice.plans), failing)

    def shrink(self, ran: set[Plan], failing: Callable[[], list[Plan]]) -> Iterator[Plan]:
        while self.choice is not None and self.choice.shrunk < SHRINK_LIMIT:
            failed = failing()
            if not failed:
                return
            fresh = [p for p in smaller(min(failed, key=size), self.resume_counts) if p not in ran]
            if not fresh:
                return
            ran.add(fresh[0])
            self.choice.shrunk += 1
            yield fresh[0]

    def keep(self, hit: int, order: int, counts: Mapping[str, int]) -> None:
        """How often the depth-1 resume of (hit, order) reached each point (the largest over the test's drives)."""
        seen = self.resume_counts.setdefault((hit, order), {})
        for point, n in counts.items():
            seen[point] = max(seen.get(point, 0), n)
