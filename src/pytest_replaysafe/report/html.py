"""``--crash-html``: the matrix as one self-contained HTML page (no network): the grid, filters by outcome,
backend, mode, tool and test, and per cell a timeline of what happened (:mod:`pytest_replaysafe.report.timeline`), its
verdict and the gap rule that applied. The page is ``report.html`` with the cells embedded as JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from pytest_replaysafe.report import grid
from pytest_replaysafe.report import outputs as report

PLACEHOLDER = "__DATA__"


def page_data(cells: Sequence[dict[str, Any]], seed: int, exposure: dict[str, Any] | None = None) -> dict[str, Any]:
    """The embedded data: the JSON report plus the grid's row and column order."""
    from tenxgraph.core.crashpoints import list_crash_points

    described = {p.name: p.description for p in list_crash_points()}
    g = grid.Grid.of(cells)
    data = report.to_json(cells, seed, exposure)
    data["columns"] = [f"{b}/{m}" for b, m in g.columns]
    data["left_out"] = grid.left_out(cells)
    data["points"] = [{"name": p, "group": grid.group_of(p), "description": described.get(p, "")} for p in g.points]
    return data


def render(cells: Sequence[dict[str, Any]], seed: int, exposure: dict[str, Any] | None = None) -> str:
    template = resources.files("pytest_replaysafe.report").joinpath("report.html").read_text(encoding="utf-8")
    # Inside <script>, "</" could end the element early: JSON allows writing it as "<\/".
    payload = json.dumps(page_data(cells, seed, exposure), separators=(",", ":")).replace("</", "<\\/")
    return template.replace(PLACEHOLDER, payload)


def write(path: Path, cells: Sequence[dict[str, Any]], seed: int, exposure: dict[str, Any] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(cells, seed, exposure), encoding="utf-8")
