"""pytest-replaysafe, registered through the ``pytest11`` entry point ``replaysafe``: the hooks.

Without ``--crash-matrix`` a marked test runs once, normally (its tool executions are still checked). With it,
the test expands into one item per crash point x backend x mode (:mod:`pytest_replaysafe.matrix.cells`); each item runs
the test body once per hit of its point, crashing and resuming there (:mod:`pytest_replaysafe.run.harness`), and the
verdicts (:mod:`pytest_replaysafe.judge.verdict`) go to the terminal and reports (:mod:`pytest_replaysafe.reporter`).
Options live in :mod:`pytest_replaysafe.options`, fixtures in :mod:`pytest_replaysafe.fixtures`. Importing this
module imports nothing of the runtime.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from pytest_replaysafe import hookspecs, options
from pytest_replaysafe.fixtures import (  # noqa: F401 - fixtures are found by name in the plugin module
    _replaysafe_cell,
    _replaysafe_matrix_pg,
    _replaysafe_pg,
    _replaysafe_redis,
    _replaysafe_seed_faker,
    approvals,
    cell_seed,
    crash_run,
    crash_run_key,
    effects,
    faker_seed,
    pg_checkpointer,
    pg_dsn,
    pg_redis_checkpointer,
    pg_schema,
    redis_url,
    replaysafe_checkpointer,
    replaysafe_workdir,
)
from pytest_replaysafe.matrix import cells as matrix
from pytest_replaysafe.options import settings_key


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "crash_matrix(points=None, backends=None, modes=None, tools=None, depth=1, budget=8): with --crash-matrix, "
        "crash and resume this test at every crash point x backend x mode; tools= limits the at-most-once check to "
        "those tools; depth=2 also crashes during the resume, under budget= schedules per item",
    )
    settings = options.read_settings(config)
    config.stash[settings_key] = settings
    if settings.enabled or config.getoption("--crash-list"):
        options.load_registry(config, settings)
    if settings.shard is not None:
        from pytest_replaysafe.matrix.shards import Selector

        selector = Selector(settings.shard, options.plan_options(config, settings), settings.shard_costs)
        config.pluginmanager.register(selector, "replaysafe-shard")
    if settings.enabled and not hasattr(config, "workerinput"):
        from pytest_replaysafe.reporter import MatrixReporter

        config.pluginmanager.register(MatrixReporter(settings, config), "replaysafe-reporter")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:  # xdist: every worker uses the controller's seed
    node.workerinput["replaysafe_seed"] = node.config.stash[settings_key].seed


def pytest_cmdline_main(config: pytest.Config) -> int | None:
    if not config.getoption("--crash-list"):
        return None
    config._do_configure()
    try:
        from tenxgraph.core.crashpoints import list_crash_points

        for point in list_crash_points():  # in the order they fire in a run
            print(f"{point.name:26} {point.kind:5}  {point.location:50}  {point.description}")
    finally:
        config._ensure_unconfigure()
    return 0


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    settings = config.stash[settings_key]
    return options.header(settings) if settings.enabled else None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("crash_matrix") is None:
        return
    if "crash_run" not in metafunc.fixturenames:
        return  # that test's own error, at its setup (pytest_runtest_setup); the file's other tests run
    settings = metafunc.config.stash[settings_key]
    if settings.enabled:
        matrix.expand(metafunc, settings)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    replay = config.stash[settings_key].replay
    if replay is not None:  # --crash-replay: only the items with failing cells
        replay.select(config, items)


NO_CRASH_RUN = (
    "{nodeid} is marked crash_matrix but does not use the crash_run fixture: add a crash_run parameter and drive "
    "the agent with crash_run.invoke(app, input) (or remove the marker); nothing else can be crashed or checked"
)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("crash_matrix") is not None and "crash_run" not in getattr(item, "fixturenames", ()):
        pytest.fail(NO_CRASH_RUN.format(nodeid=item.nodeid), pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run a marked test's body once per hit, so that its assertions hold for every hit (a failure names it)."""
    run = pyfuncitem.stash.get(crash_run_key, None)
    fn = pyfuncitem.obj
    if run is None or pyfuncitem.get_closest_marker("crash_matrix") is None or inspect.iscoroutinefunction(fn):
        return None
    names = [name for name in inspect.signature(fn).parameters if name in pyfuncitem.funcargs]
    failures: list[tuple[int | None, Exception, str]] = []

    def execute() -> None:
        faker: Any = pyfuncitem.funcargs.get("faker")
        if faker is not None:  # the same data in every hit
            faker.seed_instance(cell_seed(pyfuncitem.config, pyfuncitem.nodeid))
        try:
            fn(**{name: pyfuncitem.funcargs[name] for name in names})
        except Exception as exc:
            run.body_failed(exc)
            failures.append((run.hit, exc, run.repro()))

    execute()
    if not run.driven:
        if failures:
            raise failures[0][1]
        run.check_routed()
    for plan in run.planned_executions():
        run.begin_execution(*plan)
        execute()
    run.conclude()
    if failures:
        _, exc, repro = failures[0]
        if run.cell is not None:
            hits = ", ".join(str(h) for h, _, _ in failures)  # (a hit may fail in several orders and schedules)
            exc.add_note(f"replaysafe: the test failed at hit(s) {hits} of {run.cell.id}; repro: {repro}")
        raise exc
    return True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Known gaps become xfailed and a strict gap that did not show becomes a failure, once the test body (and
    its own assertions) passed in every hit."""
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
