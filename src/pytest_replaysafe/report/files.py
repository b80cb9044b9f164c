"""Where a matrix's reports go: the JSON, Markdown and HTML files a run (or a merge of shards) was asked for, and
the grid in GitHub's step summary."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_replaysafe.report import html, outputs


def write_all(
    cells: Sequence[dict[str, Any]],
    seed: int,
    exposure: dict[str, Any],
    schedules: dict[str, int] | None,
    paths: tuple[Path | None, Path | None, Path | None],
    shard: dict[str, Any] | None = None,
) -> list[Path]:
    """The JSON, Markdown and HTML reports at *paths* (each where given), and the grid in
    ``$GITHUB_STEP_SUMMARY`` when it is set; returns what was written."""
    json_path, markdown_path, html_path = paths
    written = []
    if json_path is not None:
        outputs.write_json(json_path, cells, seed, exposure, schedules, shard)
        written.append(json_path)
    if markdown_path is not None:
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(
            outputs.markdown(cells, seed) + outputs.exposure_markdown(exposure["rows"], exposure["rate"])
        )
        written.append(markdown_path)
    if html_path is not None:
        html.write(html_path, cells, seed, exposure)
        written.append(html_path)
    summary_path = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_path:
        with open(summary_path, "a", encoding="utf-8") as fh:
            fh.write(outputs.markdown(cells, seed) + "\n")
    return written
