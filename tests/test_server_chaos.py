"""The chaos benchmark's client: a response the chaos cut is counted as cut, never an error that stops `make bench`."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from benchmarks import server_chaos


@pytest.fixture
def cutting_server() -> Iterator[list[int]]:
    """A loopback server that answers every request with a header promising 100 bytes, sends 10, and closes (a
    server killed mid-body); then one that closes before any status line."""
    servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    replies = [b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789", b""]

    def serve(server: socket.socket, reply: bytes) -> None:
        with server:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                with conn:
                    conn.recv(65536)
                    conn.sendall(reply)

    threads = [threading.Thread(target=serve, args=pair, daemon=True) for pair in zip(servers, replies, strict=True)]
    for t in threads:
        t.start()
    yield [s.getsockname()[1] for s in servers]
    for s in servers:
        s.close()


def test_a_response_cut_by_chaos_counts_as_cut(cutting_server: list[int]) -> None:
    """IncompleteRead (cut mid-body) and RemoteDisconnected (cut before the status line) end the run as None,
    the phase's 'cut by chaos', as a reset connection does; they used to stop the benchmark with no summary."""
    body_cut, status_cut = cutting_server
    assert server_chaos.post([body_cut], 0, "t-body") is None
    assert server_chaos.post([status_cut], 0, "t-status") is None
