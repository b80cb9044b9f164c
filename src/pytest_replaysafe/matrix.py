"""The crash matrix: backends, modes and the cells a marked test expands into.

A cell is one crash point on one backend in one mode; when it runs, it first does a clean run to count how often
its point is reached, then crashes and resumes once per hit (each hit is reported as its own cell).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_replaysafe import services
from tenxgraph.storage.checkpointer.base import BaseCheckpointer

MODES = ("inprocess", "sigkill", "stream", "concurrent")
#: Modes a cell runs in unless --crash-modes / modes= say otherwise (``concurrent`` forks 4 resumers: opt in).
DEFAULT_MODES = ("inprocess", "sigkill", "stream")
#: Modes whose resume happens in other processes: not applicable to storage that lives in one process.
PROCESS_MODES = frozenset({"sigkill", "concurrent"})
CONCURRENT_RESUMERS = 4
"""``stream`` is ``inprocess`` with the crashing run and the resume both driven through ``astream``;
``concurrent`` crashes in-process, then several forked processes resume the thread at the same moment."""
#: Points that only exist when a fixture that fires them is in use.
FIXTURE_POINTS = {"tool.in_flight": "effects"}


@dataclass(frozen=True, slots=True)
class Backend:
    """A checkpointer for the matrix. ``factory(request)`` builds one per cell (register teardown on request)."""

    name: str
    factory: Callable[[pytest.FixtureRequest], BaseCheckpointer]
    durable: bool = True
    available: Callable[[], bool] = lambda: True


@dataclass(frozen=True, slots=True)
class Cell:
    point: str
    backend: str
    mode: str

    @property
    def id(self) -> str:
        return f"{self.point}-{self.backend}-{self.mode}"


def _memory(request: pytest.FixtureRequest) -> BaseCheckpointer:
    from tenxgraph.storage.checkpointer import InMemoryCheckpointer

    return InMemoryCheckpointer()


def _sqlite(request: pytest.FixtureRequest) -> BaseCheckpointer:
    from tenxgraph.storage.checkpointer import SqliteCheckpointer

    path: Path = request.getfixturevalue("replaysafe_workdir") / "replaysafe.db"
    cp = SqliteCheckpointer(path)
    request.addfinalizer(cp.close)
    return cp


def _postgres_available() -> bool:
    return bool(os.environ.get(services.ENV_PG)) or services.services_required() or services.docker_available()


def _redis_available() -> bool:
    return _postgres_available() and (
        bool(os.environ.get(services.ENV_REDIS)) or services.services_required() or services.docker_available()
    )


BUILTIN_BACKENDS = (
    Backend("memory", _memory, durable=False),
    Backend("sqlite", _sqlite),
    Backend("postgres", lambda request: request.getfixturevalue("pg_checkpointer"), available=_postgres_available),
    Backend(
        "postgres+redis",
        lambda request: request.getfixturevalue("pg_redis_checkpointer"),
        available=_redis_available,
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
        raise pytest.UsageError(
            f"replaysafe: unknown crash {kind} {', '.join(map(repr, unknown))} in {source}; "
            f"known {kind}s: {', '.join(known)} (pytest --crash-list shows the points)"
        )


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


def cells_for(points: Sequence[str], backends: Sequence[Backend], modes: Sequence[str]) -> list[Cell]:
    return [Cell(p, b.name, m) for p in points for b in backends for m in modes]


def marker_kwargs(marker: Any) -> dict[str, Any]:
    allowed = {"points", "backends", "modes", "tools"}
    unknown = set(marker.kwargs) - allowed
    if unknown or marker.args:
        raise pytest.UsageError(
            f"replaysafe: @pytest.mark.crash_matrix takes keyword options {sorted(allowed)}; "
            f"got {sorted(unknown) or marker.args}"
        )
    return dict(marker.kwargs)
