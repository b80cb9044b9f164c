"""``make bench``'s last step: every benchmark's JSON in one ``benchmarks/results.json`` (sections ``refund``,
``parallel``, ``turns``, ``floor``, ``observe``, ``budgets``, ``dbos``, ``redis_cache``, ``server_chaos``), and each
target printed with its measured median and min over repetitions, the load average when its part started, and
met or missed (issue #31's targets; a part that did not run prints nothing)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
SECTIONS = {
    name: f"{name}.json"
    for name in (
        "parallel",
        "turns",
        "floor",
        "observe",
        "budgets",
        "tool_node",
        "dbos",
        "pydantic_ai",
        "redis_cache",
        "server_chaos",
    )
}
#: Median ratio ours / LangGraph per backend, on the refund run (issue #31) and the other shapes (issue #16).
REFUND_TARGETS = {"memory": 0.12, "sqlite": 0.25, "postgres": 0.35}
SHAPE_TARGETS = {"memory": 0.12, "sqlite": 0.35, "postgres": 0.35, "postgres+redis": 0.35}

Row = tuple[str, str, str, str, str]  # target, median, min, load, verdict


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def load_of(section: dict[str, Any]) -> str:
    value = section.get("load_average_at_start", section.get("load_1min"))
    return "" if value is None else f"{float(value):.2f}"


def rows(merged: dict[str, Any]) -> Iterator[Row]:
    refund = merged.get("refund", {})
    for backend, target in REFUND_TARGETS.items():
        spread = refund.get("ratio_spread", {}).get(backend)
        if spread:
            yield (
                f"refund run, {backend}: <= {target} of LangGraph",
                str(spread["median"]),
                str(spread["min"]),
                load_of(refund),
                verdict(spread["median"] <= target),
            )
    trips = refund.get("postgres_round_trips_per_run")
    if trips is not None:
        yield ("PostgreSQL round trips per refund run <= 5 (ledger writes included)", str(trips), "", "",
               verdict(trips <= 5))  # fmt: skip
    floor = merged.get("floor", {}).get("postgres", {}).get("refund_over_floor")
    if floor:
        yield ("refund run on PostgreSQL <= 3x its commit floor", str(floor["median"]), str(floor["min"]),
               load_of(merged["floor"]), verdict(floor["median"] <= 3))  # fmt: skip
    sqlite_floor = merged.get("floor", {}).get("sqlite", {}).get("refund_over_floor")
    if sqlite_floor:
        yield ("refund run on SQLite <= 2x its commit floor", str(sqlite_floor["median"]), str(sqlite_floor["min"]),
               load_of(merged["floor"]), verdict(sqlite_floor["median"] <= 2))  # fmt: skip
    cell = refund.get("crash_matrix", {}).get("sigkill")
    if cell:
        yield ("crash matrix: SIGKILL cell on SQLite <= 10 ms (median)", str(cell["median_cell_ms"]), "",
               load_of(refund), verdict(cell["median_cell_ms"] <= 10))  # fmt: skip
    observe = merged.get("observe")
    if observe:
        off = observe["rows"]["tracing_off"]
        yield (f"tracing off within noise (+-{observe['noise']})", str(off["ratio_median"]), str(off["ratio_min"]),
               load_of(observe), verdict(observe["tracing_off_within_noise"] == "met"))  # fmt: skip
    budgets = merged.get("budgets", {})
    for row in budgets.get("replay_safe_tool_node", []):
        commits = round(row["ledger_commits_per_batch"], 2)
        yield (f"ReplaySafeToolNode, N = {row['n']}: <= 1 commit per batch over ToolNode", str(commits), "", "",
               verdict(commits <= 1))  # fmt: skip
    tool_node = merged.get("tool_node", {})
    for row in tool_node.get("rows", []):
        name = f"ReplaySafeToolNode / ToolNode, N = {row['n']}, {row['backend']}: <= {tool_node['target']}"
        yield (name, str(row["ratio_median"]), str(row["ratio_min"]), load_of(tool_node),
               verdict(row["ratio_median"] <= tool_node["target"]))  # fmt: skip
        reads = row["ledger_reads_per_batch"]
        yield (f"ReplaySafeToolNode, N = {row['n']}, {row['backend']}: 1 ledger read per batch", str(reads), "", "",
               verdict(reads <= 1))  # fmt: skip
    approval = budgets.get("approval")
    if approval:
        yield ("approval pause + resume: 2 round trips on PostgreSQL", str(approval["extra_round_trips"]), "", "",
               verdict(approval["extra_round_trips"] <= 2))  # fmt: skip
    for row in merged.get("parallel", {}).get("rows", []):
        if "ratio_median" in row:
            target = SHAPE_TARGETS.get(row["backend"], 0.35)
            name = f"N = {row['n']} parallel calls, {row['backend']}: <= {target}"
            yield (name, str(row["ratio_median"]), str(row.get("ratio_min", "")), load_of(merged["parallel"]),
                   verdict(row["ratio_median"] <= target))  # fmt: skip
    for backend, row in merged.get("turns", {}).get("backends", {}).items():
        for turn, ratio in row.get("ratio", {}).items():
            target = SHAPE_TARGETS.get(backend, 0.35)
            yield (f"turn {turn}, {backend}: <= {target}", str(ratio["median"]), str(ratio.get("min", "")),
                   load_of(merged["turns"]), verdict(ratio["median"] <= target))  # fmt: skip


def main() -> None:
    results_path = HERE / "results.json"
    refund: dict[str, Any] = json.loads(results_path.read_text()) if results_path.exists() else {}
    merged: dict[str, Any] = {"refund": refund.get("refund", refund)}
    for name, file in SECTIONS.items():
        path = HERE / file
        if path.exists():
            merged[name] = json.loads(path.read_text())
    results_path.write_text(json.dumps(merged, indent=2) + "\n")
    table = list(rows(merged))
    print(f"{'target':68} {'median':>8} {'min':>8} {'load':>6}  verdict")
    for target, median, low, load, ok in table:
        print(f"{target:68} {median:>8} {low:>8} {load:>6}  {ok}")
    for row in merged.get("dbos", {}).get("rows", []):
        print(
            f"beside DBOS Transact ({row['backend']}): ours / DBOS {row['ratio_median']} median, {row['ratio_min']} "
            f"min (load {merged['dbos'].get('load_at_start')}; no target)"
        )
    for row in merged.get("pydantic_ai", {}).get("rows", []):
        print(
            f"Pydantic AI agent ({row['backend']}): LedgerDurability / DBOSDurability {row['ratio_to_dbos_median']} "
            f"median, range {row['ratio_to_dbos_range']}; / bare {row['ratio_to_bare_median']} "
            f"(load {merged['pydantic_ai'].get('load_at_start')}; no target)"
        )
    met = sum(1 for row in table if row[4] == "met")
    print(f"{met} of {len(table)} targets met; written to {results_path}")


if __name__ == "__main__":
    main()
