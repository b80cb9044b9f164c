"""pytest-replaysafe: fixtures and the ``--crash-matrix`` for replay-safety tests.

Registered through the ``pytest11`` entry point ``replaysafe``. Without ``--crash-matrix`` a marked test runs
once, normally (its tool executions are still checked). With it, the test expands into one item per
crash point x backend x mode; each item crashes and resumes at every hit of its point.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_replaysafe import hookspecs, matrix, services

if TYPE_CHECKING:
    from pytest_replaysafe.effects import Effects
    from pytest_replaysafe.gaps import GapRule
    from pytest_replaysafe.harness import CrashRun
    from tenxgraph.storage.checkpointer.base import BaseCheckpointer
    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

CELL_PROPERTY = "replaysafe_cell"
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
    registry: dict[str, matrix.Backend] = field(default_factory=dict)
    rules: tuple[GapRule, ...] = ()
    cells: list[dict[str, Any]] = field(default_factory=list)


settings_key = pytest.StashKey[Settings]()


# -- options --------------------------------------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
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
        help="comma-separated backends: memory, sqlite, postgres, postgres+redis, or your own",
    )
    group.addoption("--crash-modes", default=None, help="comma-separated modes: inprocess, sigkill")
    group.addoption("--crash-hits", default=None, help="only these hits of each point, e.g. 2 (for a repro)")
    group.addoption("--crash-seed", default=None, help="master seed (a number, or 'last' for the previous run's)")
    group.addoption("--crash-report", default=None, metavar="PATH.json", help="write the matrix as JSON here")
    group.addoption("--crash-markdown", default=None, metavar="PATH.md", help="write the grid as Markdown here")
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


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "crash_matrix(points=None, backends=None, modes=None, tools=None): with --crash-matrix, crash and resume "
        "this test at every crash point x backend x mode; tools= limits the at-most-once check to those tools",
    )
    enabled = bool(config.getoption("--crash-matrix") or config.getini("crash_matrix"))
    report = _option(config, "crash_report")
    markdown = _option(config, "crash_markdown")
    settings = Settings(
        enabled=enabled,
        seed=_seed(config),
        points=matrix.split_names(_option(config, "crash_points")),
        backends=matrix.split_names(_option(config, "crash_backends")),
        modes=matrix.split_names(_option(config, "crash_modes")),
        hits=matrix.parse_hits(config.getoption("--crash-hits")),
        report=Path(report) if report else None,
        markdown=Path(markdown) if markdown else None,
    )
    config.stash[settings_key] = settings
    cache = getattr(config, "cache", None)
    if enabled and cache is not None and not hasattr(config, "workerinput"):
        cache.set(SEED_CACHE_KEY, settings.seed)
    if enabled or config.getoption("--crash-list"):
        _load_registry(config, settings)
    if enabled and not hasattr(config, "workerinput"):
        config.pluginmanager.register(MatrixReporter(settings), "replaysafe-reporter")


def _load_registry(config: pytest.Config, settings: Settings) -> None:
    import pytest_replaysafe.effects  # noqa: F401 - declares tool.in_flight
    from pytest_replaysafe.gaps import KNOWN_GAPS
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
    if settings.modes:
        matrix.check_names("mode", settings.modes, matrix.MODES, "--crash-modes")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:  # xdist: every worker uses the controller's seed
    node.workerinput["replaysafe_seed"] = node.config.stash[settings_key].seed


def pytest_cmdline_main(config: pytest.Config) -> int | None:
    if not config.getoption("--crash-list"):
        return None
    config._do_configure()
    try:
        from tenxgraph.core.crashpoints import list_crash_points

        root = Path.cwd()
        for point in list_crash_points():
            try:
                where = f"{Path(point.file).relative_to(root)}:{point.line}"
            except ValueError:
                where = point.location
            print(f"{point.name:26} {point.kind:5}  {where}  {point.description}")
    finally:
        config._ensure_unconfigure()
    return 0


def pytest_report_header(config: pytest.Config) -> str | None:
    s = config.stash[settings_key]
    if not s.enabled:
        return None
    return f"replaysafe: crash matrix on, seed {s.seed} (repeat with --crash-seed={s.seed} or --crash-seed=last)"


# -- expansion --------------------------------------------------------------------------------------------
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("crash_matrix")
    if marker is None:
        return
    settings = metafunc.config.stash[settings_key]
    if "crash_run" not in metafunc.fixturenames:
        raise pytest.UsageError(f"{metafunc.definition.nodeid} is marked crash_matrix but does not use crash_run")
    if not settings.enabled:
        return
    from tenxgraph.core.crashpoints import list_crash_points

    opts = matrix.marker_kwargs(marker)
    where = f"@crash_matrix of {metafunc.definition.nodeid}"
    known = {p.name for p in list_crash_points()}
    points = matrix.split_names(opts.get("points")) or settings.points
    if points is None:
        points = [p for p in sorted(known) if matrix.FIXTURE_POINTS.get(p) in (None, *metafunc.fixturenames)]
    matrix.check_names("point", points, known, where)
    backends = matrix.split_names(opts.get("backends")) or list(settings.registry)
    matrix.check_names("backend", backends, settings.registry, where)
    if settings.backends:
        backends = [b for b in backends if b in settings.backends]
    chosen = [settings.registry[b] for b in backends if settings.registry[b].available()]
    marked_modes = matrix.split_names(opts.get("modes"))
    if marked_modes:
        matrix.check_names("mode", marked_modes, matrix.MODES, where)
    modes = marked_modes or settings.modes or list(matrix.DEFAULT_MODES)
    if marked_modes and settings.modes:
        modes = [m for m in modes if m in settings.modes]
    cells = matrix.cells_for(points, chosen, modes)
    metafunc.parametrize("_replaysafe_cell", cells, ids=[c.id for c in cells], indirect=True)


crash_run_key = pytest.StashKey["CrashRun"]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Known gaps become xfailed and a strict gap that did not show becomes a failure, once the test body (and
    its own assertions) passed."""
    report: pytest.TestReport = yield
    run = item.stash.get(crash_run_key, None)
    if run is None or call.when != "call" or not report.passed:
        return report
    if run.missing_gap:
        report.outcome = "failed"
        report.longrepr = run.missing_gap
    elif run.gap_message:
        report.outcome = "skipped"
        report.wasxfail = run.gap_message
    return report


def _cell_of(item: pytest.Item) -> matrix.Cell | None:
    callspec = getattr(item, "callspec", None)
    cell = callspec.params.get("_replaysafe_cell") if callspec is not None else None
    return cell if isinstance(cell, matrix.Cell) else None


# -- fixtures ---------------------------------------------------------------------------------------------
@pytest.fixture
def _replaysafe_cell(request: pytest.FixtureRequest) -> matrix.Cell | None:
    return getattr(request, "param", None)


def _cell_seed(request: pytest.FixtureRequest) -> int:
    seed = request.config.stash[settings_key].seed
    return random.Random(f"{seed}:{request.node.nodeid}").randrange(2**32)


@pytest.fixture
def faker_seed(request: pytest.FixtureRequest) -> int:
    """Seed for Faker's ``faker`` fixture: the master seed mixed with the test (cell) id."""
    return _cell_seed(request)


@pytest.fixture(autouse=True)
def _replaysafe_seed_faker(request: pytest.FixtureRequest) -> None:
    """In crash-matrix tests, Faker's ``faker`` is seeded from the cell, so data is reproducible per seed."""
    if "faker" in request.fixturenames and request.node.get_closest_marker("crash_matrix") is not None:
        request.getfixturevalue("faker").seed_instance(_cell_seed(request))


@pytest.fixture
def replaysafe_workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A scratch folder shared by every process of one cell (execution log, effects, markers, SQLite files).

    On tmpfs (``/dev/shm``) when there is one, or under ``$REPLAYSAFE_WORKDIR``: the matrix kills processes, not
    the machine, so flushing to a disk would only slow it down; the code path (WAL, locks, processes) is the same.
    """
    base = os.environ.get("REPLAYSAFE_WORKDIR") or ("/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    if base is None:
        yield tmp_path_factory.mktemp("replaysafe")
        return
    path = Path(tempfile.mkdtemp(prefix="replaysafe-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def crash_run(
    request: pytest.FixtureRequest, _replaysafe_cell: matrix.Cell | None, replaysafe_workdir: Path
) -> Iterator[CrashRun]:
    """Runs the test's agent clean, or (in a matrix cell) crashed and resumed at every hit, and judges it."""
    from pytest_replaysafe.harness import CrashRun

    settings = request.config.stash[settings_key]
    marker = request.node.get_closest_marker("crash_matrix")
    tools = matrix.marker_kwargs(marker).get("tools") if marker else None
    cell = _replaysafe_cell
    if cell is None:
        factory = matrix.BUILTIN_BACKENDS[1].factory  # a normal run uses the embedded durable default
    else:
        backend = settings.registry[cell.backend]
        if cell.mode in matrix.PROCESS_MODES and not backend.durable:
            request.node.user_properties.append(
                (
                    CELL_PROPERTY,
                    json.dumps(
                        {
                            "test": request.node.nodeid,
                            "point": cell.point,
                            "hit": 0,
                            "backend": cell.backend,
                            "mode": cell.mode,
                            "outcome": "not_applicable",
                            "gap": None,
                            "executions": {},
                            "duration_s": 0.0,
                            "repro": "",
                            "detail": "in-memory state does not survive the process",
                        }
                    ),
                )
            )
            pytest.skip(f"not_applicable: {cell.backend} state does not survive a killed process")
        factory = backend.factory
    checkpointer = factory(request)
    run = CrashRun(
        nodeid=request.node.nodeid,
        cell=cell,
        checkpointer=checkpointer,
        workdir=replaysafe_workdir,
        seed=settings.seed,
        rules=settings.rules or _default_rules(),
        tools=list(tools) if tools else None,
        hits=settings.hits,
        effects=request.getfixturevalue("effects") if "effects" in request.fixturenames else None,
    )
    request.node.stash[crash_run_key] = run
    yield run
    for result in run.results:
        request.node.user_properties.append((CELL_PROPERTY, json.dumps(result.to_json())))


def _default_rules() -> tuple[GapRule, ...]:
    from pytest_replaysafe.gaps import KNOWN_GAPS

    return KNOWN_GAPS


@pytest.fixture
def effects(replaysafe_workdir: Path) -> Effects:
    """A durable side-effect simulator (like a payment API) that honours idempotency keys."""
    from pytest_replaysafe.effects import Effects

    return Effects(replaysafe_workdir / "effects.db")


BACKEND_NAMES = ("memory", "sqlite", "postgres", "postgres+redis")


@pytest.fixture(params=BACKEND_NAMES)
def replaysafe_checkpointer(request: pytest.FixtureRequest) -> BaseCheckpointer:
    """A checkpointer of each backend (PostgreSQL ones skip, or fail in CI, without a server)."""
    backend = {b.name: b for b in matrix.BUILTIN_BACKENDS}[request.param]
    return backend.factory(request)


# -- services -------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def _replaysafe_pg() -> Iterator[services.Service]:
    service = services.start_postgres()
    yield service
    service.stop()


@pytest.fixture(scope="session")
def _replaysafe_redis() -> Iterator[services.Service]:
    service = services.start_redis()
    yield service
    service.stop()


@pytest.fixture
def pg_dsn(_replaysafe_pg: services.Service) -> str:
    """A PostgreSQL DSN (REPLAYSAFE_PG_DSN, or a testcontainers container); skips/fails when there is none."""
    return services.address_or_skip(_replaysafe_pg, "PostgreSQL")


@pytest.fixture
def redis_url(_replaysafe_redis: services.Service) -> str:
    """A Redis URL (REPLAYSAFE_REDIS_URL, or a testcontainers container); skips/fails when there is none."""
    return services.address_or_skip(_replaysafe_redis, "Redis")


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[str]:
    """A fresh schema name for this test, dropped afterwards (tests can run in parallel)."""
    schema = services.new_schema_name()
    yield schema
    services.drop_schema(pg_dsn, schema)


@pytest.fixture
def pg_checkpointer(pg_dsn: str, pg_schema: str) -> Iterator[PgCheckpointer]:
    """A PgCheckpointer without cache, on an isolated schema."""
    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

    cp = PgCheckpointer(postgres_dsn=pg_dsn, schema=pg_schema)
    yield cp
    cp.close()


@pytest.fixture
def pg_redis_checkpointer(pg_dsn: str, redis_url: str, pg_schema: str) -> Iterator[PgCheckpointer]:
    """A PgCheckpointer with the Redis cache, on an isolated schema (and cache key prefix)."""
    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

    cp = PgCheckpointer(postgres_dsn=pg_dsn, redis_url=redis_url, schema=pg_schema)
    yield cp
    cp.close()


# -- reporting ------------------------------------------------------------------------------------------
class MatrixReporter:
    """Collects cells from test reports (on the xdist controller too) and writes the grid and reports."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.total: int | None = None
        self.done: set[str] = set()

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.total = sum(1 for item in items if _cell_of(item) is not None)

    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(self, report: pytest.TestReport) -> Any:
        """Progress while a long matrix runs: the verbose status word says how many cells are done."""
        status = yield
        is_cell = any(f"-{mode}]" in report.nodeid for mode in matrix.MODES)
        finished = report.when == "call" or (report.when == "setup" and not report.passed)
        if is_cell and finished and isinstance(status, tuple) and len(status) == 3 and isinstance(status[2], str):
            self.done.add(report.nodeid)  # the status hook is asked again for summary lines: count items once
            total = f"/{self.total}" if self.total else ""
            category, letter, word = status
            return category, letter, f"{word} [{len(self.done)}{total} cells]" if word else word
        return status

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":
            return
        for name, value in report.user_properties:
            if name == CELL_PROPERTY and isinstance(value, str):
                self.settings.cells.append(json.loads(value))

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        from pytest_replaysafe import report

        settings = self.settings
        cells = sorted(settings.cells, key=lambda c: (c["test"], c["point"], c["backend"], c["mode"], c["hit"]))
        terminalreporter.section(f"replaysafe crash matrix (seed {settings.seed})")
        if not cells:
            terminalreporter.write_line("no crash-matrix cells ran (mark tests with @pytest.mark.crash_matrix)")
            return
        for line in report.text_grid(cells):
            terminalreporter.write_line(line)
        for cell in cells:
            if cell["outcome"] in ("violation", "vacuous", "error"):
                terminalreporter.write_line(
                    f"{cell['outcome'].upper()} {cell['test']} hit {cell['hit']}: {cell['detail']}"
                )
                if cell["repro"]:
                    terminalreporter.write_line(f"  repro: {cell['repro']}")
        if settings.report is not None:
            report.write_json(settings.report, cells, settings.seed)
            terminalreporter.write_line(f"crash matrix report: {settings.report}")
        if settings.markdown is not None:
            settings.markdown.write_text(report.markdown(cells, settings.seed))
            terminalreporter.write_line(f"crash matrix grid: {settings.markdown}")
        summary_path = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary_path:
            with open(summary_path, "a", encoding="utf-8") as fh:
                fh.write(report.markdown(cells, settings.seed) + "\n")
