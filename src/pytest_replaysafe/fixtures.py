"""The plugin's fixtures: ``crash_run``, ``effects``, the service fixtures and per-cell seeding.

Nothing of the runtime is imported until a fixture runs."""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_replaysafe.matrix import cells as matrix
from pytest_replaysafe.matrix import services
from pytest_replaysafe.options import settings_key

if TYPE_CHECKING:
    from pytest_replaysafe.judge.gaps import GapRule
    from pytest_replaysafe.run.approvals import Approvals
    from pytest_replaysafe.run.driver import CellDriver
    from pytest_replaysafe.run.effects import Effects
    from pytest_replaysafe.run.faults import Proxy
    from pytest_replaysafe.run.harness import CrashRun
    from tenxgraph.storage.checkpointer.base import BaseCheckpointer
    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

CELL_PROPERTY = "replaysafe_cell"
crash_run_key: pytest.StashKey[CellDriver] = pytest.StashKey()


@pytest.fixture
def _replaysafe_cell(request: pytest.FixtureRequest) -> matrix.Cell | None:
    return getattr(request, "param", None)


def cell_seed(config: pytest.Config, nodeid: str) -> int:
    """The master seed mixed with the test (cell) id: the seed of the cell's data."""
    return random.Random(f"{config.stash[settings_key].seed}:{nodeid}").randrange(2**32)


def _cell_seed(request: pytest.FixtureRequest) -> int:
    return cell_seed(request.config, request.node.nodeid)


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


def _not_applicable(request: pytest.FixtureRequest, cell: matrix.Cell, seed: int) -> None:
    from pytest_replaysafe.judge.outcome import CellResult, Outcome

    result = CellResult(
        request.node.nodeid,
        cell.point,
        0,
        cell.backend,
        cell.mode,
        Outcome.NOT_APPLICABLE,
        repro=matrix.repro_line(request.node.nodeid, cell, seed),
        detail="in-memory state does not survive the process",
    )
    request.node.user_properties.append((CELL_PROPERTY, json.dumps(result.to_json())))
    pytest.skip(f"not_applicable: {cell.backend} state does not survive a killed process")


@pytest.fixture
def crash_run(
    request: pytest.FixtureRequest, _replaysafe_cell: matrix.Cell | None, replaysafe_workdir: Path
) -> Iterator[CrashRun]:
    """Runs the test's agent clean, or (in a matrix cell) crashed and resumed at each hit, and judges it."""
    from pytest_replaysafe.judge.exposure import EXPOSURE_PROPERTY
    from pytest_replaysafe.matrix.schedules import SCHEDULES_PROPERTY
    from pytest_replaysafe.run.harness import CellPlan, CrashRun

    settings = request.config.stash[settings_key]
    marker = request.node.get_closest_marker("crash_matrix")
    marked = matrix.marker_kwargs(marker) if marker else {}
    tools = marked.get("tools")
    cell = _replaysafe_cell
    backend = None
    if cell is None:
        factory = matrix.BUILTIN_BACKENDS[1].factory  # a normal run uses the embedded durable default
    else:
        backend = settings.registry[cell.backend]
        if cell.mode in matrix.PROCESS_MODES and not backend.durable:
            _not_applicable(request, cell, settings.seed)
        factory = backend.cell_factory or backend.factory
    plan = CellPlan(
        nodeid=request.node.nodeid,
        cell=cell,
        backend=backend,
        seed=settings.seed,
        rules=settings.rules or _default_rules(),
        repro=matrix.repro_line(request.node.nodeid, cell, settings.seed) if cell is not None else "",
        tools=list(tools) if tools else None,
        hits=settings.hits,
        orders=settings.orders,
        depth=settings.depth_for(marked),
        faults=settings.faults,
        replay=settings.replay.executions(request.node.nodeid) if settings.replay else None,
        framework=str(marked.get("framework", "tenxgraph")),
    )
    effects = request.getfixturevalue("effects") if "effects" in request.fixturenames else None
    approvals = request.getfixturevalue("approvals") if "approvals" in request.fixturenames else None
    crash_run = CrashRun(plan, factory(request), replaysafe_workdir, effects, approvals)
    run = request.node.stash[crash_run_key] = crash_run.driver  # the plugin drives the cell through it
    request.addfinalizer(run.close)
    yield crash_run
    expected = request.node.get_closest_marker("xfail") is not None and not request.config.option.runxfail
    for result in run.results:
        result.expected = expected
        request.node.user_properties.append((CELL_PROPERTY, json.dumps(result.to_json())))
    if run.planner.choice is not None:
        budget = -1 if run.depth.budget is None else run.depth.budget
        choice = {k: getattr(run.planner.choice, k) for k in ("candidates", "enumerated", "sampled", "shrunk")}
        request.node.user_properties.append((SCHEDULES_PROPERTY, json.dumps({**choice, "budget": budget})))
    if cell is not None and run.exposure:
        sample = {"backend": cell.backend, "windows": run.exposure}
        request.node.user_properties.append((EXPOSURE_PROPERTY, json.dumps(sample)))


def _default_rules() -> tuple[GapRule, ...]:
    from pytest_replaysafe.judge.gaps import KNOWN_GAPS

    return KNOWN_GAPS


@pytest.fixture
def effects(replaysafe_workdir: Path) -> Effects:
    """A durable side-effect simulator (like a payment API) that honours idempotency keys."""
    from pytest_replaysafe.run.effects import Effects

    return Effects(replaysafe_workdir / "effects.db")


@pytest.fixture
def approvals(replaysafe_workdir: Path) -> Approvals:
    """The person the harness plays: answers every pause of a run driven through ``crash_run`` (approves
    everything unless ``approvals.answer(...)`` says otherwise). With it, a marked test's cells include the pause
    points and the ``double-resume`` mode."""
    from pytest_replaysafe.run.approvals import Approvals

    return Approvals(replaysafe_workdir)


BACKEND_NAMES = ("memory", "sqlite", "postgres", "postgres+redis")
#: Seconds an idle connection beyond the first stays in a matrix worker's pools: a cell's burst (a contest, parallel
#: calls) is over by then, and workers that kept each pool full would outgrow PostgreSQL's connections together.
POOL_IDLE_S = 1.0


@pytest.fixture(params=BACKEND_NAMES)
def replaysafe_checkpointer(request: pytest.FixtureRequest) -> BaseCheckpointer:
    """A checkpointer of each backend (PostgreSQL ones skip, or fail in CI, without a server)."""
    backend = {b.name: b for b in matrix.BUILTIN_BACKENDS}[request.param]
    return backend.factory(request)


class SharedPg:
    """One worker's PostgreSQL checkpointers for matrix cells (with and without Redis), on one schema of its own,
    made on first use; at the end they are closed, the schema dropped and the cache keys under its prefix deleted."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.dsn: str | None = None
        self.made: dict[tuple[str | None, str | None], tuple[PgCheckpointer, str | None]] = {}
        self.proxies: dict[tuple[str, int], Proxy] = {}

    def checkpointer(self, dsn: str, redis_url: str | None, proxied: str | None = None) -> PgCheckpointer:
        """*proxied*: ``outage`` (PostgreSQL) or ``redis-down`` (Redis) connects through a proxy of the harness's
        (:mod:`pytest_replaysafe.run.faults`), which that fault cuts."""
        from pytest_replaysafe.run.faults import proxied_dsn, proxied_redis_url
        from pytest_replaysafe.run.intruder import MATRIX_LEASE_S
        from tenxgraph.storage.checkpointer.pg import PgCheckpointer

        self.dsn = dsn
        if (redis_url, proxied) not in self.made:
            pg = proxied_dsn(dsn, self.proxies) if proxied == "outage" else dsn
            url = proxied_redis_url(redis_url, self.proxies) if proxied == "redis-down" and redis_url else redis_url
            cp = PgCheckpointer(
                postgres_dsn=pg, redis_url=url, schema=self.schema, run_lease=MATRIX_LEASE_S, pool_max_idle=POOL_IDLE_S
            )
            self.made[redis_url, proxied] = (cp, redis_url)
        return self.made[redis_url, proxied][0]

    def close(self) -> None:
        for cp, url in self.made.values():
            cp.close()
            if url is not None:
                services.delete_redis_keys(url, cp.cache_prefix)
        for proxy in self.proxies.values():
            proxy.close()
        if self.dsn is not None:
            services.drop_schema(self.dsn, self.schema)


@pytest.fixture(scope="session")
def _replaysafe_matrix_pg(request: pytest.FixtureRequest) -> Iterator[SharedPg]:
    """``REPLAYSAFE_MATRIX_SCHEMA`` names the schema (plus ``_s<K>of<N>`` for shard K of N, and ``_<xdist worker>``),
    so that shards and workers sharing one PostgreSQL and Redis never share tables or keys; default: a new random
    name."""
    base = os.environ.get("REPLAYSAFE_MATRIX_SCHEMA") or services.new_schema_name("rsm")
    shard = request.config.stash[settings_key].shard
    if shard is not None and os.environ.get("REPLAYSAFE_MATRIX_SCHEMA"):
        base += f"_s{shard.index}of{shard.count}"
    workerinput = getattr(request.config, "workerinput", None)
    shared = SharedPg(f"{base}_{workerinput['workerid']}" if workerinput else base)
    yield shared
    shared.close()


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
    """A PgCheckpointer with the Redis cache, on an isolated schema (and so its own cache key prefix)."""
    from tenxgraph.storage.checkpointer.pg import PgCheckpointer

    cp = PgCheckpointer(postgres_dsn=pg_dsn, redis_url=redis_url, schema=pg_schema)
    yield cp
    cp.close()
    services.delete_redis_keys(redis_url, cp.cache_prefix)
