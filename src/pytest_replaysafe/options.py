"""Command-line options, ini keys and the run's settings (parsed once, in ``pytest_configure``)."""

from __future__ import annotations

import random
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_replaysafe.matrix import cells as matrix
from pytest_replaysafe.matrix import services
from pytest_replaysafe.matrix.cells import DEFAULT_BUDGET

if TYPE_CHECKING:
    from pytest_replaysafe.judge.gaps import GapRule
    from pytest_replaysafe.matrix.orders import Orders
    from pytest_replaysafe.matrix.schedules import Depth
    from pytest_replaysafe.matrix.shards import Shard
    from pytest_replaysafe.report.replay import Replay

SEED_CACHE_KEY = "replaysafe/seed"


@dataclass
class Settings:
    enabled: bool
    seed: int
    points: list[str] | None
    backends: list[str] | None
    modes: list[str] | None
    hits: set[int] | None
    report: Path | None
    markdown: Path | None
    html: Path | None = None
    #: Seconds between progress lines while the matrix runs (0: after every test; None: never).
    progress_every: float | None = 5.0
    #: The crash rate the exposure estimate assumes (``--crash-rate``), as given and in crashes per second.
    rate: str = "1/day"
    rate_per_s: float = 1 / 86400
    #: Completion orders of parallel calls to run each hit under (``--crash-orders``, ``--crash-order``).
    orders: Orders | None = None  # (None: the default, see :class:`.matrix.orders.Orders`)
    #: ``--crash-replay``: the failing cells of an earlier report, to run again exactly.
    replay: Replay | None = None
    #: ``--crash-faults``: storage faults to inject (see :mod:`pytest_replaysafe.run.faults`).
    faults: frozenset[str] = frozenset({"cache"})
    #: Crashes during recovery (``--crash-depth``, ``--crash-budget``, ``--crash-then``); None where not given.
    depth: int | None = None
    budget: str | None = None
    then: str | None = None
    registry: dict[str, matrix.Backend] = field(default_factory=dict)
    #: Backends that cannot run here (defaulted ones only: a requested one is a usage error), with the reason.
    unavailable: dict[str, str] = field(default_factory=dict)
    rules: tuple[GapRule, ...] = ()
    #: ``--crash-modes=all``: the whole product (every mode at every point, every storage fault, and the budgeted
    #: contests at every lock window a default run adds; its recovery and prune cells run at every point anyway).
    every_mode: bool = False
    #: ``--crash-shard=K/N`` and ``--crash-shard-costs``: run only shard K of the plan (:mod:`.matrix.shards`).
    shard: Shard | None = None
    shard_costs: Path | None = None

    def depth_for(self, marked: dict[str, Any]) -> Depth:
        """A test's depth and budget: the command line's (or ini's), else its marker's ``depth=`` and ``budget=``."""
        depth = self.depth if self.depth is not None else marked.get("depth")
        budget = self.budget if self.budget is not None else marked.get("budget")
        from pytest_replaysafe.matrix.schedules import Depth

        return Depth.parse(depth, budget, self.then)


settings_key = pytest.StashKey[Settings]()


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("replaysafe", "replay-safety crash matrix (pytest-replaysafe)")
    group.addoption(
        "--crash-matrix",
        action="store_true",
        default=None,
        help="expand tests marked crash_matrix into crash point x backend x mode cells",
    )
    group.addoption("--crash-points", default=None, help="comma-separated crash points to use (default: all)")
    group.addoption(
        "--crash-backends",
        default=None,
        help=f"comma-separated backends: memory, sqlite, postgres ({services.ENV_PG}), postgres+redis "
        f"({services.ENV_PG} + {services.ENV_REDIS}), or your own; a named backend that cannot run is an error",
    )
    group.addoption(
        "--crash-modes",
        default=None,
        help="comma-separated modes: inprocess, sigkill, stream (the default, plus budgeted contest, recovery and "
        "prune cells per durable backend); concurrent, recovery, prune at every point; the storage-fault modes "
        "drop, outage, redis-down, readonly (with --crash-faults); or all: every mode at every point, every "
        "fault, and the budgeted contests at every lock window (the whole product, as CI runs it)",
    )
    group.addoption("--crash-hits", default=None, help="only these hits of each point, e.g. 2 (for a repro)")
    group.addoption("--crash-seed", default=None, help="master seed (a number, or 'last' for the previous run's)")
    group.addoption("--crash-report", default=None, metavar="PATH.json", help="write the matrix as JSON here")
    group.addoption("--crash-markdown", default=None, metavar="PATH.md", help="write the grid as Markdown here")
    group.addoption(
        "--crash-html",
        default=None,
        metavar="PATH.html",
        help="write the matrix as one self-contained HTML page here (grid, filters, a timeline per cell)",
    )
    group.addoption(
        "--crash-progress",
        default=None,
        metavar="SECONDS",
        help="print cells done / total and the time left at most this often (default 5; 0: after every test; "
        "off: never; -q turns it off too)",
    )
    group.addoption(
        "--crash-rate",
        default=None,
        metavar="N/PERIOD",
        help="crashes per process the exposure estimate assumes, such as 1/day (default), 3/week, 1/12h",
    )
    group.addoption(
        "--crash-orders",
        default=None,
        metavar="N|all",
        help="run each hit under N completion orders of its parallel calls (default 1), or 'all': every "
        "permutation of batches of up to 4 calls, so every subset of siblings is the one finished at the crash",
    )
    group.addoption(
        "--crash-replay",
        default=None,
        metavar="REPORT.json",
        help="run again exactly the failing cells of an earlier --crash-report (its seed, items, hits and orders)",
    )
    group.addoption("--crash-order", default=None, metavar="K", help="only completion order K (for a repro)")
    group.addoption(
        "--crash-depth",
        default=None,
        metavar="1|2",
        help="2: also crash during the resume (at each point and hit the resume reaches, under --crash-budget) "
        "and resume again; default 1",
    )
    group.addoption(
        "--crash-budget",
        default=None,
        metavar="N|all",
        help=f"depth-2 schedules per test item (default {DEFAULT_BUDGET}; the replay path is always run, the rest "
        "drawn by seed), or 'all'",
    )
    group.addoption(
        "--crash-faults",
        default=None,
        metavar="F,G|all|none",
        help="storage faults: cache (a stale, future or flushed Redis cache before each resume; the default); "
        "cells of their own at each point: drop (PostgreSQL connections terminated), outage (PostgreSQL "
        "unreachable for a while), redis-down (Redis unreachable), readonly (SQLite writes refused); all; none",
    )
    group.addoption(
        "--crash-shard",
        default=None,
        metavar="K/N",
        help="run shard K of N (1 to N) of one deterministic plan of the matrix (give --crash-seed; the same on "
        "every machine), each item in exactly one shard; merge the shards' --crash-report files with "
        "python -m pytest_replaysafe merge",
    )
    group.addoption(
        "--crash-shard-costs",
        default=None,
        metavar="REPORT.json",
        help="balance the shards by each item's seconds in an earlier --crash-report (every shard gives the same)",
    )
    group.addoption("--crash-then", default=None, metavar="POINT@J", help="only this second crash (for a repro)")
    group.addoption(
        "--crash-list",
        action="store_true",
        default=False,
        help="print every registered crash point with its source location, and exit",
    )
    parser.addini("crash_matrix", "run the crash matrix (like --crash-matrix)", type="bool", default=False)
    parser.addini("crash_points", "default crash points", default="")
    parser.addini("crash_backends", "default crash-matrix backends", default="")
    parser.addini("crash_modes", "default crash-matrix modes", default="")
    parser.addini("crash_report", "default --crash-report path", default="")
    parser.addini("crash_markdown", "default --crash-markdown path", default="")
    parser.addini("crash_html", "default --crash-html path", default="")
    parser.addini("crash_progress", "default --crash-progress (seconds, or off)", default="")
    parser.addini("crash_orders", "default --crash-orders (a number, or all)", default="")
    parser.addini("crash_depth", "default --crash-depth (1 or 2)", default="")
    parser.addini("crash_budget", "default --crash-budget (schedules per test item, or all)", default="")
    parser.addini(
        "crash_faults", "default --crash-faults (cache, drop, outage, redis-down, readonly, all, none)", default=""
    )
    parser.addini("crash_rate", "default --crash-rate (crashes per process, such as 1/day)", default="")


def _option(config: pytest.Config, name: str) -> Any:
    value = config.getoption(f"--{name.replace('_', '-')}")
    if value is None or value == "":
        value = config.getini(name) or None
    return value


def _seed(config: pytest.Config) -> int:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "replaysafe_seed" in workerinput:
        return int(workerinput["replaysafe_seed"])
    raw = config.getoption("--crash-seed")
    if raw == "last":
        cache = getattr(config, "cache", None)
        cached = cache.get(SEED_CACHE_KEY, None) if cache is not None else None
        if cached is None:
            raise pytest.UsageError(
                "replaysafe: --crash-seed=last but no previous seed is cached (is the cacheprovider plugin "
                "disabled?); give the seed printed in the header as a number"
            )
        return int(cached)
    if raw is not None:
        try:
            return int(raw)
        except ValueError:
            raise pytest.UsageError(f"replaysafe: --crash-seed={raw!r}: give a whole number or 'last'") from None
    return random.SystemRandom().randrange(10**9)


def _progress(config: pytest.Config) -> float | None:
    raw = _option(config, "crash_progress")
    if raw is None:
        return 5.0
    if str(raw).strip().lower() == "off":
        return None
    return float(matrix.parse_number(raw, "--crash-progress", 0, "seconds (0 or more) or 'off'", float))


def read_settings(config: pytest.Config) -> Settings:
    """The plugin's settings from options and ini; what only a matrix needs is imported when its option is given
    (a plain ``pytest`` run loads none of it)."""
    replay_path = config.getoption("--crash-replay")
    replay = None
    if replay_path:
        from pytest_replaysafe.report.replay import Replay

        replay = Replay.load(Path(replay_path))
    enabled = bool(config.getoption("--crash-matrix") or config.getini("crash_matrix") or replay)
    report = _option(config, "crash_report")
    markdown = _option(config, "crash_markdown")
    html = _option(config, "crash_html")
    settings = Settings(
        enabled=enabled,
        seed=_seed(config),
        points=matrix.split_names(_option(config, "crash_points")),
        backends=matrix.split_names(_option(config, "crash_backends")),
        modes=matrix.split_names(_option(config, "crash_modes")),
        hits=matrix.parse_hits(config.getoption("--crash-hits")),
        report=Path(report) if report else None,
        markdown=Path(markdown) if markdown else None,
        html=Path(html) if html else None,
        progress_every=_progress(config),
    )
    if replay is not None:
        settings.replay = replay
        if config.getoption("--crash-seed") is None and not hasattr(config, "workerinput"):
            settings.seed = replay.seed  # the report's seed, unless one is given
    orders, order = _option(config, "crash_orders"), config.getoption("--crash-order")
    if orders is not None or order is not None:
        from pytest_replaysafe.matrix.orders import Orders

        settings.orders = Orders.parse(orders, order)
    depth = _option(config, "crash_depth")
    settings.budget, settings.then = _option(config, "crash_budget"), config.getoption("--crash-then")
    if depth or settings.then:
        from pytest_replaysafe.matrix.schedules import Depth

        settings.depth = Depth.parse(depth, settings.budget, settings.then).depth
    faults = _option(config, "crash_faults")
    if faults is not None:
        from pytest_replaysafe.run.faults import parse as parse_faults

        settings.faults = parse_faults(faults)
    rate = _option(config, "crash_rate")
    if rate:
        from pytest_replaysafe.judge.exposure import parse_rate

        settings.rate = str(rate)
        try:
            settings.rate_per_s = parse_rate(settings.rate)
        except ValueError as exc:
            raise pytest.UsageError(f"replaysafe: --crash-rate: {exc}") from None
    _read_shard(config, settings)
    cache = getattr(config, "cache", None)
    if enabled and cache is not None and not hasattr(config, "workerinput"):
        cache.set(SEED_CACHE_KEY, settings.seed)
    return settings


def _read_shard(config: pytest.Config, settings: Settings) -> None:
    raw, costs = config.getoption("--crash-shard"), config.getoption("--crash-shard-costs")
    if raw is None:
        if costs:
            raise pytest.UsageError("replaysafe: --crash-shard-costs balances shards: give --crash-shard=K/N too")
        return
    from pytest_replaysafe.matrix.shards import Shard, ShardError

    try:
        settings.shard = Shard.parse(str(raw))
    except ShardError as exc:
        raise pytest.UsageError(f"replaysafe: {exc}") from None
    if not settings.enabled:
        raise pytest.UsageError("replaysafe: --crash-shard splits the crash matrix: give --crash-matrix too")
    if config.getoption("--crash-seed") in (None, "last") and not hasattr(config, "workerinput"):
        raise pytest.UsageError(
            f"replaysafe: --crash-shard={raw}: give the seed as a number (--crash-seed=N), the same to every "
            "shard: each machine must compute the same plan"
        )
    settings.shard_costs = Path(costs) if costs else None


def plan_options(config: pytest.Config, settings: Settings) -> dict[str, Any]:
    """What decides a matrix's cells besides the collected items: part of a shard plan's digest."""
    given = {n: _option(config, f"crash_{n}") for n in ("points", "backends", "modes", "orders", "depth", "budget")}
    given["faults"] = _option(config, "crash_faults")
    given.update({n: config.getoption(f"--crash-{n}") for n in ("hits", "order", "then")})
    return {"seed": settings.seed, **{k: None if v is None else str(v) for k, v in sorted(given.items())}}


def load_registry(config: pytest.Config, settings: Settings) -> None:
    """Backends and gap rules (built in + hooks); unknown names and requested backends that cannot run here are
    usage errors, so requested coverage is never silently missing."""
    from pytest_replaysafe.judge.gaps import KNOWN_GAPS
    from tenxgraph.core.crashpoints import list_crash_points

    registry = {b.name: b for b in matrix.BUILTIN_BACKENDS}
    for extra in config.hook.pytest_replaysafe_add_backends(config=config):
        for backend in extra:
            registry[backend.name] = backend
    settings.registry = registry
    settings.rules = KNOWN_GAPS + tuple(
        r for extra in config.hook.pytest_replaysafe_add_gaps(config=config) for r in extra
    )
    known_points = {p.name for p in list_crash_points()}
    if settings.points:
        matrix.check_names("point", [p.split(":")[0] for p in settings.points], known_points, "--crash-points")
    if settings.backends:
        matrix.check_names("backend", settings.backends, registry, "--crash-backends")
    if settings.modes == ["all"]:
        from pytest_replaysafe.run.faults import FAULTS

        settings.modes, settings.every_mode = [*matrix.MODES, *matrix.FAULT_CELL_MODES], True
        settings.faults = frozenset(FAULTS)
    if settings.modes:
        matrix.check_names("mode", settings.modes, (*matrix.MODES, *matrix.FAULT_CELL_MODES), "--crash-modes")
    for name, backend in registry.items():
        reason = backend.unavailable()
        if reason is None:
            continue
        if settings.backends and name in settings.backends:
            raise pytest.UsageError(
                f"replaysafe: crash backend {name!r} was requested (--crash-backends) but cannot run here: {reason}"
            )
        settings.unavailable[name] = reason


def header(settings: Settings) -> list[str]:
    """The seed with its repeat line, and (when no backends were named) the backends left out, and why."""
    lines = [f"replaysafe: crash matrix on, seed {settings.seed} (repeat: --crash-seed={settings.seed} or =last)"]
    if settings.shard is not None:
        lines.append(f"replaysafe: shard {settings.shard} of the plan (merge: python -m pytest_replaysafe merge)")
    if not settings.backends:
        for name, reason in sorted(settings.unavailable.items()):
            lines += textwrap.wrap(f"replaysafe: backend {name} left out: {reason}", 100, subsequent_indent="  ")
    return lines
