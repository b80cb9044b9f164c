"""One Pydantic AI agent, three ways: durable on our ledger (``LedgerDurability``), durable on DBOS Transact through
Pydantic AI's own DBOS engine (``DBOSDurability``, the run inside a DBOS workflow and each tool a ``DBOS.step``,
as its docs write them: DBOS journals model turns itself, a function tool only as a step), and bare (no
durability: the floor). The agent is the support agent of examples/pydantic_ai_support (Pydantic AI's
``FunctionModel``; a refund and an email at once, then a receipt, then the answer: three model turns, three tool
calls), its provider in memory. Each run is a new run (a new ``run_id``, a new workflow id), interleaved in chunks
of 10 runs, repeated ``--reps`` times; the ratios of medians are the figures.

DBOS is a process-wide singleton, so each storage runs in a child process of its own (``--backend``): SQLite (a
file of its own per engine, WAL on both; DBOS's set before it opens it) and, with ``REPLAYSAFE_PG_DSN``,
PostgreSQL (DBOS's system database one this benchmark creates and drops; ours a schema of its own). The parent
writes ``benchmarks/pydantic_ai.json``.

    python -m benchmarks.pydantic_ai_peer [--runs 100] [--reps 3]   # needs the bench extra (dbos, pydantic-ai)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import uuid
from collections.abc import Callable, Coroutine
from contextlib import ExitStack
from pathlib import Path
from typing import Any, cast

RESULTS = Path(__file__).with_name("pydantic_ai.json")
PROMPT = "Please refund order A-1042."


def ours(ledger: Any) -> Callable[[], None]:
    from examples.payments import LocalProvider
    from examples.pydantic_ai_support.agent import FINAL, build_agent

    agent = build_agent(LocalProvider(), ledger=ledger)

    def run() -> None:
        assert agent.run_sync(PROMPT, run_id=uuid.uuid4().hex).output == FINAL

    return run


def bare() -> Callable[[], None]:
    from examples.payments import LocalProvider
    from examples.pydantic_ai_support.agent import FINAL, build_agent

    agent = build_agent(LocalProvider())

    def run() -> None:
        assert agent.run_sync(PROMPT).output == FINAL

    return run


def dbos(system_database_url: str) -> Callable[[], None]:
    """The same agent with Pydantic AI's ``DBOSDurability``, each run a DBOS workflow (launched here)."""
    from dbos import DBOS, SetWorkflowID
    from pydantic_ai.durable_exec.dbos import DBOSDurability

    from examples.payments import LocalProvider
    from examples.pydantic_ai_support.agent import FINAL, build_agent

    DBOS(config={"name": "tenxbench-pydantic-ai", "system_database_url": system_database_url})
    agent = build_agent(LocalProvider(), engine=(DBOSDurability(), DBOS.step()))  # (each tool a DBOS step)

    async def workflow(prompt: str) -> str:
        return str((await agent.run(prompt)).output)

    # (typed here: dbos may not be installed, and then its decorator is untyped to mypy)
    support = cast(Callable[[str], Coroutine[Any, Any, str]], DBOS.workflow()(workflow))

    DBOS.launch()
    loop = asyncio.new_event_loop()

    def run() -> None:
        with SetWorkflowID(uuid.uuid4().hex):
            assert loop.run_until_complete(support(PROMPT)) == FINAL

    return run


def child(backend: str, runs: int, reps: int) -> dict[str, Any]:
    """One storage, in this process: the three interleaved, *reps* times; medians and ratios."""
    from benchmarks.bench import compare
    from benchmarks.dbos_peer import storages

    with ExitStack() as stack:
        url, ledger = storages(backend, stack, "pai")
        contenders = {"tenxgraph": ours(ledger), "dbos": dbos(url), "bare": bare()}
        repetitions = [compare(contenders, runs, warmup=10) for _ in range(reps)]
    to_dbos = [r["tenxgraph"]["median_ms"] / r["dbos"]["median_ms"] for r in repetitions]
    to_bare = [r["tenxgraph"]["median_ms"] / r["bare"]["median_ms"] for r in repetitions]
    return {
        "backend": backend,
        **{f"{name}_ms": round(statistics.median(r[name]["median_ms"] for r in repetitions), 3) for name in contenders},
        "ratio_to_dbos_median": round(statistics.median(to_dbos), 3),
        "ratio_to_dbos_range": [round(min(to_dbos), 3), round(max(to_dbos), 3)],
        "ratio_to_bare_median": round(statistics.median(to_bare), 3),
        "runs": runs,
        "reps": reps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], help="(the child process's part)")
    args = parser.parse_args()
    if args.backend:
        print(json.dumps(child(args.backend, args.runs, args.reps)))
        return
    try:
        import dbos  # noqa: F401
        import pydantic_ai.durable_exec.dbos  # noqa: F401
    except ImportError as exc:
        print(f"{exc.name} is not installed: it comes with the bench extra (make bench installs it); skipped")
        return
    from benchmarks.dbos_peer import by_children

    by_children("benchmarks.pydantic_ai_peer", args, RESULTS, "the Pydantic AI benchmark", show)


def show(row: dict[str, Any]) -> str:
    return (
        f"  {row['backend']:9} LedgerDurability {row['tenxgraph_ms']:7.3f} ms  DBOSDurability {row['dbos_ms']:7.3f} "
        f"ms  bare {row['bare_ms']:6.3f} ms  ours/DBOS median {row['ratio_to_dbos_median']} "
        f"(range {row['ratio_to_dbos_range']})  ours/bare {row['ratio_to_bare_median']}"
    )


if __name__ == "__main__":
    main()
