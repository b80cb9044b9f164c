"""The crash matrix: backends, modes, and the cells a marked test expands into.

A cell is one crash point on one backend in one mode; when it runs, it first does a clean run to count how often
its point is reached, then crashes and resumes once per hit, running the test body once per hit (each hit is
reported as its own cell). (Past the ~350-line guide: expansion reads top to bottom with the tables it uses, the
frameworks' points and modes, the backends and the lock windows.)"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from pytest_replaysafe.matrix import services

#: Depth-2 schedules per test item unless ``--crash-budget`` says otherwise (see :mod:`.schedules`): a depth-2
#: schedule costs about one and a half depth-1 hits (a crash, a crashed resume, a resume).
DEFAULT_BUDGET = 8

if TYPE_CHECKING:
    from tenxgraph.storage.checkpointer.base import BaseCheckpointer

MODES = ("inprocess", "sigkill", "stream", "concurrent", "recovery", "prune", "double-resume", "resumers")
#: Modes a cell runs in unless --crash-modes / modes= say otherwise; ``concurrent`` joins them on a budget.
DEFAULT_MODES = ("inprocess", "sigkill", "stream")
#: Modes whose resume happens in other processes: not applicable to storage that lives in one process.
PROCESS_MODES = frozenset({"sigkill", "concurrent", "recovery", "prune", "double-resume", "resumers"})
#: The budgeted cells a default run adds per durable backend, one hit each: a ``concurrent`` contest crashed at
#: the node that follows the first model turn for every lock window (:data:`LOCK_WINDOWS`:
#: a run lock or compare-and-swap that does not hold shows at one of them on any graph), the server's
#: ``recovery`` as the resume there, and the retention job run between a crash after a record and its resume
#: (``prune``).
BUDGET_POINT = "run.before_node"
PRUNE_POINT = "tool.after_record"
#: Where a run holds its thread's lock, in the order a run reaches them. ``release``: the run's last node has
#: completed and its last state write, with which the lock is released, comes next. ``ledger_read_after_turn``:
#: the tool node's ledger read after a model turn the lock holder ran itself (its budgeted cell crashes at the
#: first node, so the resume runs the model turn, writes its assistant message, and pauses before the read): a
#: read answered from that write's round trip would miss what the run that takes over records.
LOCK_WINDOWS = (
    "run.before_node",
    "tool.before_ledger_read",
    "tool.before_invoke",
    "tool.after_return",
    "tool.after_record",
    "node.after_complete",
    "run.after_advance",
    "release",
    "ledger_read_after_turn",
)
#: Budgeted contests crashed at the first node (hit 1) instead of after the first model turn.
FIRST_NODE_WINDOWS = frozenset({"ledger_read_after_turn"})
#: Faults with cells of their own (``--crash-faults``; see :mod:`pytest_replaysafe.run.faults`): each is the mode of
#: its cells too.
FAULT_CELL_MODES = ("drop", "outage", "redis-down", "readonly")
#: Cells whose checkpointer connects through the harness's proxies (see :func:`_shared_pg`).
PROXIED_MODES = frozenset({"outage", "redis-down"})
#: Points that only exist when a fixture that fires them is in use.
FIXTURE_POINTS = {
    "tool.in_flight": "effects",
    "approval.after_pause": "approvals",
    "approval.after_decision": "approvals",
}
#: Points that exist in some modes only: a model streams its reply to a caller only when the run is streamed. Where
#: the test's model does not stream (a custom node calling ``agenerate``), the cell is not applicable.
MODE_POINTS = {"model.mid_stream": ("stream",)}
#: Modes that join a test's default ones when it uses a fixture: a person's answers sent twice, where the harness
#: plays the person (``approvals``); each of them sent by k processes at once (``resumers``, when asked).
FIXTURE_MODES = {"double-resume": "approvals", "resumers": "approvals"}
#: Of those, the modes a test's cells run in only when asked (``--crash-modes=resumers`` or ``all``, or the
#: marker's ``modes=``): a default run (``make demo``) stays short.
ASKED_MODES = frozenset({"resumers"})
#: What makes such a point reachable, for the vacuous message.
REACH = {
    "model.mid_stream": (
        "it fires when a model streams its reply to a streamed run (stream_mode='messages'): ReactAgent's model "
        "node, or tenxgraph.models.generate() in your own, with a model that has astream() (OpenAI, Gemini, "
        "ScriptedModel)"
    ),
    "tool.in_flight": (
        "it fires inside the effects fixture's apply(), the moment a side effect is done and its tool has not "
        "returned: apply your tool's effect through effects.apply(kind, payload, idempotency_key) (your provider "
        "stand-in), or call tenxgraph.core.crashpoints.crash_point('tool.in_flight') in your tool right after its "
        "effect (docs/crash-matrix.md#fixtures)"
    ),
}


def reach_hint(point: str) -> str:
    """Why a point a clean run never reached can be reached, if the table knows (with a leading separator)."""
    return f": {REACH[point]}" if point in REACH else ""


@dataclass(frozen=True, slots=True)
class Backend:
    """A checkpointer for the matrix. ``factory(request)`` builds one per cell (register teardown on request).

    ``unavailable()`` says why the backend cannot run here (None: it can); ``stale_cache(checkpointer, thread,
    workdir)``, for a backend with a cache, makes the cache stale before each resume."""

    name: str
    factory: Callable[[pytest.FixtureRequest], BaseCheckpointer]
    durable: bool = True
    unavailable: Callable[[], str | None] = lambda: None
    stale_cache: Callable[[BaseCheckpointer, str, Path], str | None] | None = None
    #: For matrix cells only, when they can share more than a test may (default: ``factory``).
    cell_factory: Callable[[pytest.FixtureRequest], BaseCheckpointer] | None = None
    #: Faults with cells of their own this backend can suffer (see :mod:`pytest_replaysafe.run.faults`).
    faults: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Cell:
    point: str
    backend: str
    mode: str
    #: A budgeted cell of a default run: one hit only.
    budget: bool = False
    #: ``concurrent``: the lock window the lock holder pauses at (None: its first node).
    window: str | None = None

    def budget_hit(self, reached: int) -> int:
        """The hit a budgeted cell crashes at: after the first model turn, or (:data:`FIRST_NODE_WINDOWS`) at the
        first node, so that the resume's own writes come before its window."""
        return 1 if self.window in FIRST_NODE_WINDOWS else reached

    @property
    def id(self) -> str:
        return f"{self.point}-{self.backend}-{self.mode}" + (f"@{self.window}" if self.window else "")


def _memory(request: pytest.FixtureRequest) -> BaseCheckpointer:
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    return InMemoryCheckpointer()


#: The SQLite connections of ``readonly`` cells, for that fault to turn read-only (see pytest_replaysafe.run.faults).
SQLITE_CONNECTIONS: list[sqlite3.Connection] = []


def _sqlite(request: pytest.FixtureRequest) -> BaseCheckpointer:
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    path: Path = request.getfixturevalue("replaysafe_workdir") / "replaysafe.db"
    cell = request.getfixturevalue("_replaysafe_cell") if "_replaysafe_cell" in request.fixturenames else None
    if isinstance(cell, Cell) and cell.mode == "readonly":
        SQLITE_CONNECTIONS.clear()
        cp = SqliteCheckpointer(path, on_connect=SQLITE_CONNECTIONS.append)
        request.addfinalizer(cp.close)
        return cp
    cp = SqliteCheckpointer(path)
    request.addfinalizer(cp.close)
    return cp


def first_state_path(workdir: Path, thread: str) -> Path:
    """Where the harness keeps the state a thread was created with (for the stale-cache fault)."""
    return workdir / f"{thread}.first-state.json"


def _postgres_unavailable() -> str | None:
    if os.environ.get(services.ENV_PG) or services.services_required() or services.docker_available():
        return None
    return f"{services.ENV_PG} is not set and no Docker engine answers (set {services.ENV_PG}=postgresql://...)"


def _redis_unavailable() -> str | None:
    reason = _postgres_unavailable()
    if reason is not None:
        return reason
    if os.environ.get(services.ENV_REDIS) or services.services_required() or services.docker_available():
        return None
    return f"{services.ENV_REDIS} is not set and no Docker engine answers (set {services.ENV_REDIS}=redis://...)"


CACHE_FAULTS = ("stale", "future", "flushed")


def _stale_redis(checkpointer: BaseCheckpointer, thread: str, workdir: Path) -> str | None:
    """Before each resume, Redis is put in one of three wrong states, chosen by the hit's (seeded) thread id:
    holding the thread's first state (version 1, as after a lagging or restored cache), a *future* state (a
    version far ahead, with a state no run wrote), or nothing at all (flushed). A resume must read PostgreSQL and
    never trust any of them."""
    import redis

    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

    assert isinstance(checkpointer, PgCheckpointer) and checkpointer.redis_url
    first = first_state_path(workdir, thread)
    if not first.exists():
        return None
    fault = CACHE_FAULTS[int(hashlib.sha256(thread.encode()).hexdigest(), 16) % len(CACHE_FAULTS)]
    client = redis.Redis.from_url(checkpointer.redis_url)
    key = checkpointer.cache_key(thread)
    try:
        if fault == "stale":
            client.hset(key, mapping={"version": 1, "state": first.read_text()})
        elif fault == "future":
            future = json.loads(first.read_text())
            future["meta"] = {**future.get("meta", {}), "current_node": None, "status": "done"}
            client.hset(key, mapping={"version": 10**6, "state": json.dumps(future)})
        else:
            client.delete(key)
    finally:
        client.close()
    return f"the Redis cache was left {fault} before the resume (a resume must read PostgreSQL)"


def _shared_pg(with_redis: bool) -> Callable[[pytest.FixtureRequest], BaseCheckpointer]:
    """Matrix cells use fresh random thread ids, so the cells of one worker share a PostgreSQL checkpointer (one
    schema, one pool, set up once) instead of paying a schema's set-up and drop per test item; your own tests
    that use ``pg_checkpointer`` still get a schema each."""

    def factory(request: pytest.FixtureRequest) -> BaseCheckpointer:
        shared = request.getfixturevalue("_replaysafe_matrix_pg")
        url = request.getfixturevalue("redis_url") if with_redis else None
        cell = request.getfixturevalue("_replaysafe_cell")
        proxied = cell.mode if isinstance(cell, Cell) and cell.mode in PROXIED_MODES else None
        return shared.checkpointer(request.getfixturevalue("pg_dsn"), url, proxied)  # type: ignore[no-any-return]

    return factory


BUILTIN_BACKENDS = (
    Backend("memory", _memory, durable=False),
    Backend("sqlite", _sqlite, faults=frozenset({"readonly"})),
    Backend(
        "postgres",
        lambda request: request.getfixturevalue("pg_checkpointer"),
        unavailable=_postgres_unavailable,
        cell_factory=_shared_pg(with_redis=False),
        faults=frozenset({"drop", "outage"}),
    ),
    Backend(
        "postgres+redis",
        lambda request: request.getfixturevalue("pg_redis_checkpointer"),
        unavailable=_redis_unavailable,
        stale_cache=_stale_redis,
        faults=frozenset({"drop", "outage", "redis-down"}),
        cell_factory=_shared_pg(with_redis=True),
    ),
)


def split_names(value: str | Sequence[str] | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        names = [v.strip() for v in value.replace(" ", ",").split(",")]
        return [n for n in names if n] or None
    return list(value)


def check_names(kind: str, names: Iterable[str], known: Iterable[str], source: str) -> None:
    known = sorted(known)
    unknown = sorted(set(names) - set(known))
    if unknown:
        hint = (
            " (backends come from a pytest_replaysafe_add_backends hook in a conftest.py or plugin)"
            if kind == "backend"
            else ""
        )
        raise pytest.UsageError(
            f"replaysafe: unknown crash {kind} {', '.join(map(repr, unknown))} in {source}; "
            f"known {kind}s: {', '.join(known)}{hint} (pytest --crash-list shows the points)"
        )


def parse_number(raw: object, option: str, minimum: float, what: str, kind: type[int] | type[float] = int) -> Any:
    """*raw* as a number of *kind* no smaller than *minimum*, or a usage error that names *option* and *what*."""
    try:
        number = kind(str(raw))
    except ValueError:
        number = None
    if number is None or number < minimum:
        raise pytest.UsageError(f"replaysafe: {option}={raw!r}: give {what}")
    return number


def parse_hits(value: str | None) -> set[int] | None:
    if not value:
        return None
    try:
        hits = {int(v) for v in value.split(",") if v.strip()}
    except ValueError:
        raise pytest.UsageError(f"replaysafe: --crash-hits={value!r}: give whole numbers such as 1,2") from None
    if not hits or min(hits) < 1:
        raise pytest.UsageError(f"replaysafe: --crash-hits={value!r}: hits start at 1")
    return hits


def marker_kwargs(marker: Any) -> dict[str, Any]:
    allowed = {"points", "backends", "modes", "tools", "depth", "budget", "framework"}
    unknown = set(marker.kwargs) - allowed
    if unknown or marker.args:
        raise pytest.UsageError(
            f"replaysafe: @pytest.mark.crash_matrix takes keyword options {sorted(allowed)}; "
            f"got {sorted(unknown) or marker.args}"
        )
    framework = marker.kwargs.get("framework", "tenxgraph")
    if framework not in FRAMEWORKS:
        raise pytest.UsageError(
            f"replaysafe: @pytest.mark.crash_matrix(framework={framework!r}): use one of {', '.join(FRAMEWORKS)}"
        )
    return dict(marker.kwargs)


#: What a marked test's app is built with: our runtime, LangGraph (its points, no run-lock contest or recovery
#: cells, which are our runtime's), Pydantic AI, a plain loop over a provider's SDK (docs/plain-loop.md) or a
#: function that runs an OpenAI Agents SDK agent (driven as a loop is; docs/openai-agents.md).
FRAMEWORKS = ("tenxgraph", "langgraph", "pydantic_ai", "loop", "openai_agents")
#: The modes a LangGraph app's cells run in (the others are our runtime's run lock and server). ``prune``: the
#: ledger's retention job between the kill and the resume must keep a LangGraph thread's records (it has no row
#: in our ``threads`` table: the job cannot see it finished). ``resumers``: k processes answer each pause at once.
LANGGRAPH_MODES = ("inprocess", "sigkill", "stream", "prune", "resumers")
#: The modes a Pydantic AI agent's cells run in. ``resumers``: k processes resume the crashed run at once.
PYDANTIC_AI_MODES = ("inprocess", "sigkill", "stream", "resumers")
#: The modes of a plain loop's cells: a resume is the function called again. An OpenAI Agents SDK run's also
#: ``resumers`` (k processes call it at once: ``run_replay_safe`` takes them in turn) and, where the test has the
#: ``approvals`` fixture, ``double-resume`` (each answer twice; a different one first on a resume).
LOOP_MODES = ("inprocess", "sigkill")
_MODES = {"langgraph": LANGGRAPH_MODES, "pydantic_ai": PYDANTIC_AI_MODES, "loop": LOOP_MODES,
          "openai_agents": (*LOOP_MODES, "resumers", "double-resume")}  # fmt: skip
#: Where ``resumers`` resume the crashed run itself (no pause to answer, so no ``approvals`` fixture needed).
RUN_RESUMERS = frozenset({("pydantic_ai", "resumers"), ("openai_agents", "resumers")})
_NAMES = {"langgraph": "a LangGraph app", "pydantic_ai": "a Pydantic AI agent", "loop": "a plain loop",
          "openai_agents": "an OpenAI Agents SDK agent"}  # fmt: skip


def framework_cells(framework: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The points and modes of another framework's app (None: our runtime's, every one)."""
    from tenxgraph.core.point_groups import FRAMEWORK_POINTS

    modes = _MODES.get(framework)
    return (FRAMEWORK_POINTS[framework], modes) if modes is not None else None


class Selection(Protocol):
    """What expansion needs of the run's settings (:class:`pytest_replaysafe.options.Settings` is one)."""

    points: list[str] | None
    backends: list[str] | None
    modes: list[str] | None
    registry: dict[str, Backend]
    unavailable: dict[str, str]
    faults: frozenset[str]
    every_mode: bool


def expand(metafunc: pytest.Metafunc, settings: Selection) -> None:
    """Parametrize a marked test with its cells (point x backend x mode, plus the budgeted contest)."""
    from tenxgraph.core.crashpoints import list_crash_points
    from tenxgraph.core.point_groups import FOREIGN_PREFIXES

    marker = metafunc.definition.get_closest_marker("crash_matrix")
    assert marker is not None
    opts = marker_kwargs(marker)
    framework = str(opts.get("framework", "tenxgraph"))
    own = framework_cells(framework)  # another framework's points and modes (None: ours)
    where = f"@crash_matrix of {metafunc.definition.nodeid}"
    known = {p.name for p in list_crash_points()}
    points = split_names(opts.get("points")) or settings.points
    if points is None:
        ours = [p for p in sorted(known) if not p.startswith(FOREIGN_PREFIXES)]
        points = [p for p in (own[0] if own else ours) if FIXTURE_POINTS.get(p) in (None, *metafunc.fixturenames)]
    check_names("point", points, known, where)
    backends = split_names(opts.get("backends")) or list(settings.registry)
    check_names("backend", backends, settings.registry, where)
    if settings.backends:
        backends = [b for b in backends if b in settings.backends]
    chosen = [settings.registry[b] for b in backends if b not in settings.unavailable]
    marked_modes = split_names(opts.get("modes"))
    if marked_modes:
        check_names("mode", marked_modes, (*MODES, *FAULT_CELL_MODES), where)
    modes = marked_modes or settings.modes or list(DEFAULT_MODES)
    if not marked_modes and not settings.modes:
        modes += [m for m, f in FIXTURE_MODES.items() if f in metafunc.fixturenames and m not in ASKED_MODES]
    if marked_modes and settings.modes:
        modes = [m for m in modes if m in settings.modes]
    if settings.every_mode:  # (a mode that needs a fixture runs where the test has it, as in a default run)
        has = (None, *metafunc.fixturenames)
        modes = [m for m in modes if FIXTURE_MODES.get(m) in has or (framework, m) in RUN_RESUMERS]
    if own:  # what the options ask for that the framework's app has (our runtime's points and modes it has not)
        if not split_names(opts.get("points")):
            points = [p for p in points if p in own[0]]
        modes = [m for m in modes if m in own[1]]
    cells = [
        Cell(p, b.name, m)
        for p in points
        for b in chosen
        for m in modes
        if m not in FAULT_CELL_MODES and m in MODE_POINTS.get(p, (m,))
    ]
    if not own:
        cells += _fault_cells(points, chosen, settings.faults, marked_modes or settings.modes)
    if (settings.every_mode or not (marked_modes or settings.modes)) and not own:
        budget = budget_cells([b for b in chosen if b.durable])  # (all modes: recovery and prune run at every point)
        cells += [c for c in budget if c.window is not None or not settings.every_mode]
    if not cells:
        skipped = sorted(set(backends) & set(settings.unavailable))
        reason = "; ".join(f"{b}: {settings.unavailable[b]}" for b in skipped) or "no backend or mode selected"
        if own and not skipped:
            reason = (
                f"{_NAMES[framework]} has the points {', '.join(own[0])} and the modes {', '.join(own[1])}; "
                "none of them was selected"
            )
        cells_param = [pytest.param(None, marks=pytest.mark.skip(reason=f"replaysafe: no cells ({reason})"))]
        metafunc.parametrize("_replaysafe_cell", cells_param, ids=["no-cells"], indirect=True)
        return
    metafunc.parametrize("_replaysafe_cell", cells, ids=[c.id for c in cells], indirect=True)


def budget_cells(durable: list[Backend]) -> list[Cell]:
    """The budgeted cells of a default run on each durable backend (see :data:`BUDGET_POINT`)."""
    out = []
    for b in durable:
        out += [Cell(BUDGET_POINT, b.name, "concurrent", budget=True, window=w) for w in LOCK_WINDOWS]
        out += [Cell(BUDGET_POINT, b.name, "recovery", budget=True), Cell(PRUNE_POINT, b.name, "prune", budget=True)]
    return out


def _fault_cells(
    points: list[str], backends: list[Backend], faults: frozenset[str], modes: list[str] | None
) -> list[Cell]:
    """A fault with cells of its own (``--crash-faults=drop``) runs at every crash-kind point, on the backends
    that can suffer it, unless the modes were narrowed without naming it."""
    from tenxgraph.core.crashpoints import get_crash_point

    out = []
    for fault in sorted(faults & set(FAULT_CELL_MODES)):
        if modes and fault not in modes:
            continue
        crash_points = [p for p in points if get_crash_point(p).kind == "crash" and p not in MODE_POINTS]
        out += [Cell(p, b.name, fault) for p in crash_points for b in backends if fault in b.faults]
    return out


def repro_line(nodeid: str, cell: Cell, seed: int) -> str:
    if cell.mode in FAULT_CELL_MODES:
        return f"pytest '{nodeid}' --crash-matrix --crash-seed={seed} --crash-faults={cell.mode}"
    modes = f" --crash-modes={cell.mode}" if cell.mode not in DEFAULT_MODES and not cell.budget else ""
    return f"pytest '{nodeid}' --crash-matrix --crash-seed={seed}{modes}"
