"""The API server under kill -9: 3 ``tenxgraph serve`` processes on 127.0.0.1 over one PostgreSQL (+ Redis), a
client posting N threads of a refund + email agent (``benchmarks/chaos_app.py``), and, in the chaos phase, a loop
that kill -9s a random server every 1 to 2.5 s and restarts it. The client never retries: every thread must be
finished by the servers' recovery. Afterwards each effect row is counted (outside the servers): at most once per
call, in-doubt ones reported. The same run without chaos gives the baseline; then with SIGTERM instead of SIGKILL.

    REPLAYSAFE_PG_DSN=... REPLAYSAFE_REDIS_URL=... python benchmarks/server_chaos.py [threads] [--out FILE]

Writes ``benchmarks/server_chaos.json`` (``make bench`` merges it into ``results.json``). Loopback only; it creates
and drops a schema of its own and deletes only its own Redis keys."""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Fleet:
    """The server processes, restartable on their ports."""

    def __init__(self, env: dict[str, str], size: int) -> None:
        self.env, self.ports = env, [free_port() for _ in range(size)]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        for port in self.ports:
            self.start(port)

    def start(self, port: int) -> None:
        command = [
            sys.executable,
            "-m",
            "tenxgraph.server.cli",
            "serve",
            "benchmarks.chaos_app:app",
            "--port",
            str(port),
        ]
        command += ["--recovery-interval", "1", "--lock-timeout", "2", "--log-level", "warning"]
        proc = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    self.procs[port] = proc
                    return
            except OSError:
                time.sleep(0.05)
        proc.kill()
        raise RuntimeError(f"server on port {port} did not start")

    def hit(self, sig: int) -> None:
        port = random.choice(self.ports)
        proc = self.procs.pop(port)
        proc.send_signal(sig)
        proc.wait(timeout=60)
        self.start(port)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            proc.wait(timeout=60)


def post(ports: list[int], first: int, thread: str) -> float | None:
    """One run, never retried once a server took it: its latency, or None if the server died under it (the
    connection reset, or the response cut before its status line or in its body). A refused connection (a server
    down, restarting) goes to the next server: that run never started."""
    body = json.dumps({"messages": [{"role": "user", "text": "refund 1042", "message_id": f"m-{thread}"}]})
    for attempt in range(30):
        port = ports[(first + attempt) % len(ports)]
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/threads/{thread}/runs", data=body.encode(), method="POST",
            headers={"content-type": "application/json"},
        )  # fmt: skip
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                response.read()
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ConnectionRefusedError):
                time.sleep(0.1)
                continue
            return None
        except (ConnectionError, OSError, http.client.HTTPException):
            return None  # cut by chaos: reset, or a response cut mid-body (IncompleteRead) or mid-status line
        return time.perf_counter() - started
    return None


def phase(dsn: str, schema: str, env: dict[str, str], threads: int, chaos: int | None) -> dict[str, Any]:
    """*chaos*: the signal the chaos loop sends every 1-2.5 s (None: no chaos)."""
    fleet = Fleet(env, 3)
    stop = threading.Event()
    hits = 0

    def chaos_loop() -> None:
        nonlocal hits
        while not stop.wait(random.uniform(1.0, 2.5)):
            fleet.hit(chaos)  # type: ignore[arg-type]
            hits += 1

    loop = threading.Thread(target=chaos_loop, daemon=True) if chaos is not None else None
    prefix = f"{schema}-{'none' if chaos is None else signal.Signals(chaos).name}"
    started = time.perf_counter()
    if loop is not None:
        loop.start()
    with ThreadPoolExecutor(16) as pool:
        latencies = list(pool.map(lambda i: post(fleet.ports, i, f"{prefix}-{i}"), range(threads)))
    answered = time.perf_counter() - started
    stop.set()
    if loop is not None:
        loop.join()
    deadline = time.monotonic() + 120  # the servers' recovery finishes what the chaos cut
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            left = conn.execute(
                f"SELECT count(*) FROM {schema}.threads WHERE thread_id LIKE %s AND state->'meta'->>'status' "
                "<> 'done'", (prefix + "-%",),
            ).fetchone()[0]  # type: ignore[index]  # fmt: skip
            if left == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        finished = time.perf_counter() - started
        rows = conn.execute(
            f"SELECT kind, count(*) FROM {schema}.effects WHERE thread_id LIKE %s GROUP BY kind, call_key",
            (prefix + "-%",),
        ).fetchall()
        stored = conn.execute(
            f"SELECT count(*) FROM {schema}.threads WHERE thread_id LIKE %s", (prefix + "-%",)
        ).fetchone()[0]  # type: ignore[index]
        statuses: dict[Any, Any] = dict(conn.execute(
            f"SELECT coalesce(state->'meta'->>'status', '?') || coalesce(':' || (state->'meta'->>'error'), ''), "
            f"count(*) FROM {schema}.threads WHERE thread_id LIKE %s GROUP BY 1", (prefix + "-%",),
        ).fetchall())  # fmt: skip
        errors = [str(r[0])[:200] for r in conn.execute(
            f"SELECT m.data->'content'->0->>'output' FROM {schema}.messages m WHERE m.thread_id LIKE %s "
            "AND m.data->>'role' = 'tool' AND m.data->'content'->0->>'status' = 'error'", (prefix + "-%",),
        ).fetchall()]  # fmt: skip
        answers: dict[Any, Any] = dict(conn.execute(
            f"SELECT m.data->'content'->0->>'status', count(*) FROM {schema}.messages m WHERE m.thread_id LIKE %s "
            "AND m.data->>'role' = 'tool' GROUP BY 1", (prefix + "-%",),
        ).fetchall())  # fmt: skip
    fleet.stop()
    ok = sorted(x for x in latencies if x is not None)
    duplicates = {kind: sum(1 for k, n in rows if k == kind and n > 1) for kind in ("refund", "email")}
    calls = {kind: sum(1 for k, _ in rows if k == kind) for kind in ("refund", "email")}
    return {
        "chaos": None if chaos is None else signal.Signals(chaos).name,
        "threads": threads,
        "servers_hit": hits,
        "answered": len(ok),
        "cut_by_chaos": threads - len(ok),
        "unfinished_after_recovery": int(left),
        "threads_stored": int(stored),
        "statuses": {str(k)[:120]: int(v) for k, v in statuses.items()},
        "tool_results_by_status": {str(k): int(v) for k, v in answers.items()},
        "tool_errors": sorted(set(errors)),
        "calls": calls,
        "calls_run_twice": duplicates,
        "runs_per_s": round(len(ok) / answered, 1),
        "all_done_s": round(finished, 1),
        "p50_ms": round(statistics.median(ok) * 1000, 1) if ok else None,
        "p99_ms": round(ok[min(len(ok) - 1, int(len(ok) * 0.99))] * 1000, 1) if ok else None,
    }


def main() -> None:
    threads = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 500
    out = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else HERE / "server_chaos.json"
    dsn, redis_url = os.environ["REPLAYSAFE_PG_DSN"], os.environ.get("REPLAYSAFE_REDIS_URL", "")
    schema = f"chaos_{os.getpid()}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.effects (thread_id text, call_key text, kind text)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CHAOS_DSN": dsn, "CHAOS_SCHEMA": schema, "CHAOS_REDIS": redis_url}
    try:
        load = os.getloadavg()[0]
        chosen = os.environ.get("CHAOS_PHASES", "none,SIGKILL,SIGTERM").split(",")
        signals = {"none": None, "SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM}
        phases = [phase(dsn, schema, env, threads, signals[name]) for name in chosen]
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
        if redis_url:
            from pytest_replaysafe.matrix.services import delete_redis_keys

            delete_redis_keys(redis_url, f"tenxgraph:{schema}:")
    result = {"load_average_at_start": round(load, 2), "cores": os.cpu_count(), "phases": phases}
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
