"""Test helpers: a checkpointer spy that counts calls to the inner backend; the crash matrix against a mutant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tenxgraph.state.messages import JSON, Message
from tenxgraph.storage.checkpointer.base import BaseCheckpointer, ThreadSnapshot
from tenxgraph.storage.checkpointer.delegating import DelegatingCheckpointer

ROOT = Path(__file__).resolve().parents[1]


class SpyCheckpointer(DelegatingCheckpointer):
    """Counts calls to the inner backend and remembers the keys of every ledger read (run lock and fencing are
    forwarded, so spied runs use the backend's own lock)."""

    def __init__(self, inner: BaseCheckpointer) -> None:
        super().__init__(inner)
        self.calls: Counter[str] = Counter()
        self.ledger_reads: list[list[str]] = []

    async def aget_thread(self, thread_id: str) -> ThreadSnapshot | None:
        self.calls["get_thread"] += 1
        return await super().aget_thread(thread_id)

    async def aput_thread(
        self, thread_id: str, values: dict[str, JSON], *, expected_version: int, new_messages: Sequence[Message] = ()
    ) -> int:
        self.calls["put_thread"] += 1
        return await super().aput_thread(
            thread_id, values, expected_version=expected_version, new_messages=new_messages
        )

    async def alist_messages(self, thread_id: str) -> list[Message]:
        self.calls["list_messages"] += 1
        return await super().alist_messages(thread_id)

    async def aget_tool_results(self, thread_id: str, keys: Sequence[str]) -> dict[str, dict[str, JSON]]:
        self.calls["get_tool_results"] += 1
        self.ledger_reads.append(list(keys))
        return await super().aget_tool_results(thread_id, keys)

    async def aput_tool_result(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        self.calls["put_tool_result"] += 1
        return await super().aput_tool_result(thread_id, key, record)

    async def aput_tool_intent(self, thread_id: str, key: str, record: dict[str, JSON]) -> bool:
        self.calls["put_tool_intent"] += 1
        return await super().aput_tool_intent(thread_id, key, record)


class WireServer:
    """A local HTTP server speaking a provider's wire format: answers every POST from a script of
    (status, headers, body) and records the requests. Tests never reach the internet."""

    def __init__(self) -> None:
        #: (status, headers, body): a JSON body, or bytes sent as they are (a recorded SSE stream, say).
        self.script: list[tuple[int, dict[str, str], dict[str, Any] | bytes]] = []
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                server.requests.append({"path": self.path, "body": json.loads(self.rfile.read(length))})
                status, headers, body = server.script.pop(0)
                payload = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                for name, value in {"content-type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.url = f"{self.base}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


# Two tools for the provider tests (what they return goes over the wire as tool results).
def refund_order(order_id: str, amount: float) -> str:
    """Refund an amount on an order."""
    return f"refunded {amount} on {order_id}"


def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order."""
    return {"order_id": order_id, "total": 20.0}


def mutant_matrix(folder: Path, mutant: str | None, test_file: Path, options: list[str]) -> dict[str, Any]:
    """The crash matrix over a copy of *test_file* in *folder*, in a pytest process of its own whose conftest applies
    *mutant* (tests/mutants.py; None: the runtime as it is), with *options*: its JSON report, and ``exit``."""
    folder.mkdir()
    (folder / "conftest.py").write_text(f"from tests.mutants import apply\n\napply({mutant!r})\n")
    (folder / test_file.name).write_text(test_file.read_text())
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", "no:xdist", "--crash-matrix"]
    command += [*options, "--crash-report=r.json", test_file.name]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert (folder / "r.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return {"exit": done.returncode, **json.loads((folder / "r.json").read_text())}


def mutant_reports(
    tmp_path: Path, names: Sequence[str | None], test_file: Path, options: Callable[[str | None], list[str]]
) -> dict[str | None, dict[str, Any]]:
    """:func:`mutant_matrix` for each of *names* (None: the control), two processes at a time, each in a folder of
    its own under *tmp_path*, with ``options(name)``: the reports by name."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        found = pool.map(lambda m: mutant_matrix(tmp_path / (m or "control"), m, test_file, options(m)), names)
        return dict(zip(names, found, strict=True))


def assert_each_caught(
    reports: dict[str | None, dict[str, Any]],
    causes: dict[str, str],
    outcomes: Sequence[str] = ("violation",),
    fails_the_run: bool = True,
) -> None:
    """Each mutant of *causes* is caught for its own reason: more than one cell with one of *outcomes* whose detail
    says its cause, and (with *fails_the_run*) a red run."""
    for mutant, cause in causes.items():
        caught = [c for c in reports[mutant]["cells"] if c["outcome"] in outcomes and cause in c["detail"]]
        print(f"  {mutant:30} {len(caught):4} cells: {cause!r}")
        assert len(caught) > 1, (mutant, sorted({c["detail"][:200] for c in reports[mutant]["cells"]})[:5])
        assert not fails_the_run or reports[mutant]["exit"] != 0, mutant
