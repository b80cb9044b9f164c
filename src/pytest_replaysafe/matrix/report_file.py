"""A crash-matrix report read back (``--crash-report``): by a shard plan's costs, a merge of shards and a
comparison of two runs, each of which says what it wanted the file for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class ReportFileError(ValueError):
    """A file that is not a readable crash-matrix report; the message names it and what it is missing."""


def read(path: Path) -> dict[str, Any]:
    """The report at *path*, checked to be one (a JSON object with its ``cells``)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReportFileError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise ReportFileError(f"{path} is not a crash-matrix report (no 'cells')")
    return data
