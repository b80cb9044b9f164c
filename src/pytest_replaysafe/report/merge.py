"""Shards' reports into one: what one unsharded run of the same plan would have written.

    python -m pytest_replaysafe merge SHARD.json... --out merged.json [--markdown M.md] [--html H.html]

Each report comes from ``pytest --crash-matrix --crash-shard=K/N --crash-seed=S --crash-report=...`` (one per K);
the merge refuses, naming the report and the fix: a shard missing, a shard given twice, a shard of another plan
(other tests, options, seed or N), a shard that stopped before the end of its items. The merged report has the
cells of every shard (in the order an unsharded run writes them), their summary and coverage, the exposure and
depth-2 figures computed over every shard's samples, and the terminal's grid, failures (each with its repro, the
smallest failing schedule first) and closing lines. Exit status: 0 proved, 1 a failing cell, 2 a refused merge.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_replaysafe.judge.outcome import Outcome
from pytest_replaysafe.matrix import report_file
from pytest_replaysafe.report import outputs


class MergeError(Exception):
    """A merge that would not equal an unsharded run; the message names the report and what to do."""


@dataclass(frozen=True)
class Part:
    path: Path
    data: dict[str, Any]
    shard: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.path} (shard {self.shard['index']}/{self.shard['count']})"


def load(path: Path) -> Part:
    try:
        data = report_file.read(path)
    except report_file.ReportFileError as exc:
        raise MergeError(f"{exc}: give each shard's --crash-report JSON") from exc
    shard = data.get("shard")
    if not isinstance(shard, dict):
        raise MergeError(f"{path} is not a shard's report (no 'shard'): it came from a run without --crash-shard=K/N")
    if shard.get("plan") is None:
        raise MergeError(
            f"{path}: shard {shard.get('index')}/{shard.get('count')} collected no tests (its workers failed "
            "before collecting): run it again"
        )
    return Part(path, data, shard)


def check(parts: Sequence[Part]) -> None:
    """Every shard of one plan, each once, each finished: else a MergeError naming which."""
    if not parts:
        raise MergeError("no reports given: give every shard's --crash-report (shards 1 to N)")
    first = parts[0]
    for part in parts[1:]:
        if part.shard["plan"] != first.shard["plan"] or part.shard["count"] != first.shard["count"]:
            raise MergeError(
                f"{part.name} is of plan {part.shard['plan']}, {first.name} of plan {first.shard['plan']}: "
                "shards of one plan come from one collection with the same --crash-* options, seed and N "
                "(and the same --crash-shard-costs report)"
            )
    seen: dict[int, Part] = {}
    for part in parts:
        index = int(part.shard["index"])
        if index in seen:
            raise MergeError(f"shard {index} is given twice: {seen[index].path} and {part.path}; give it once")
        seen[index] = part
    count = int(first.shard["count"])
    missing = [k for k in range(1, count + 1) if k not in seen]
    if missing:
        raise MergeError(
            f"shard(s) {', '.join(f'{k}/{count}' for k in missing)} of plan {first.shard['plan']} missing: "
            f"{len(parts)} of {count} reports given; run the missing shard(s) (--crash-shard=K/{count}) and "
            "merge them all"
        )
    for part in parts:
        unfinished = part.shard.get("unfinished") or []
        if unfinished:
            raise MergeError(
                f"{part.name} did not finish {len(unfinished)} of its {len(part.shard['items'])} items (first: "
                f"{unfinished[0]}): it stopped early (-x, --maxfail, a crash); run that shard again"
            )
    planned = sum(len(part.shard["items"]) for part in parts)
    if planned != first.shard["total"]:
        raise MergeError(f"the shards hold {planned} items, their plan {first.shard['total']}: report the bug")


@dataclass
class Merged:
    cells: list[dict[str, Any]]
    seed: int
    exposure: dict[str, Any]
    schedules: dict[str, int] | None
    xfailed: int


def merge(parts: Sequence[Part]) -> Merged:
    from pytest_replaysafe.judge.exposure import parse_rate, summarize
    from pytest_replaysafe.matrix.schedules import totals

    check(parts)
    rates = {str(part.shard.get("rate") or "1/day") for part in parts}
    if len(rates) > 1:
        raise MergeError(f"the shards assumed different --crash-rate values ({', '.join(sorted(rates))}): give one")
    rate = rates.pop()
    cells = [cell for part in parts for cell in part.data["cells"]]
    cells.sort(key=outputs.cell_order)
    samples = [s for part in parts for s in part.shard.get("exposure_samples") or []]
    depth2 = [s for part in parts for s in part.shard.get("schedule_samples") or []]
    return Merged(
        cells=cells,
        seed=int(parts[0].data["seed"]),
        exposure={"rate": rate, "rows": summarize(samples, parse_rate(rate))},
        schedules=totals(depth2) if depth2 else None,
        xfailed=sum(int(part.shard.get("xfailed") or 0) for part in parts),
    )


def terminal_lines(merged: Merged, written: Sequence[Path]) -> list[str]:
    """What the last shard's terminal would have shown for the whole matrix."""
    from pytest_replaysafe.matrix.schedules import summary_line

    depth2 = summary_line(merged.schedules) if merged.schedules is not None else None
    closing = outputs.closing_lines(merged.cells, written, merged.xfailed, depth2)
    return outputs.matrix_lines(merged.cells, merged.exposure) + closing


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_replaysafe merge",
        description="Merge the --crash-report files of every shard of one plan (--crash-shard=K/N) into one report.",
    )
    parser.add_argument("reports", nargs="+", type=Path, metavar="SHARD.json", help="every shard's --crash-report")
    parser.add_argument("--out", type=Path, required=True, metavar="PATH.json", help="the merged JSON report")
    parser.add_argument("--markdown", type=Path, default=None, metavar="PATH.md", help="the grid as Markdown")
    parser.add_argument("--html", type=Path, default=None, metavar="PATH.html", help="the self-contained HTML page")
    args = parser.parse_args(list(argv))
    from pytest_replaysafe.report import files

    try:
        merged = merge([load(path) for path in args.reports])
    except MergeError as exc:
        print(f"merge: {exc}")
        return 2
    paths = (args.out, args.markdown, args.html)
    written = files.write_all(merged.cells, merged.seed, merged.exposure, merged.schedules, paths)
    print(f"crash matrix (seed {merged.seed}), merged from {len(args.reports)} shards")
    print("\n".join(terminal_lines(merged, written)))
    failing = any(Outcome(c["outcome"]).failing and not c.get("expected") for c in merged.cells)
    return 1 if failing else 0
