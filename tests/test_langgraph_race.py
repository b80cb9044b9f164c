"""The kill at ``langgraph.late_put_writes`` (LangGraph's background-save race, played on purpose): held until a
later tool call returns, and landing all the same when none does (the threads' race went the other way on a
loaded machine), never an error of the harness's own in LangGraph's saving thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from pytest_replaysafe.run import langgraph_race
from pytest_replaysafe.run.langgraph_race import late_kill, late_kill_held
from tenxgraph.core import crashpoints
from tenxgraph.core.crashpoints import CrashInjected, crash_point


@pytest.fixture(autouse=True)
def clean_points() -> Iterator[None]:
    crashpoints.reset()
    yield
    crashpoints.reset()


def test_the_kill_is_held_until_a_later_call_returns_and_that_call_dies_with_it() -> None:
    kills: list[tuple[str, int, bool]] = []
    window: dict[str, str] = {}
    fire = late_kill(lambda name, n: kills.append((name, n, late_kill_held())), window)
    saver = threading.Thread(target=fire, args=("langgraph.late_put_writes", 2))
    saver.start()
    deadline = time.monotonic() + 5
    while not late_kill_held() and time.monotonic() < deadline:  # (the point fired in the saving thread)
        time.sleep(0.001)
    assert late_kill_held() and kills == []  # (the kill waits)
    with pytest.raises(CrashInjected):  # the later call returns, then dies with the process
        crash_point("tool.after_return")
    saver.join(5)
    assert kills == [("langgraph.late_put_writes", 2, False)]
    assert window == {"id": "*"}  # (the window: the call that returned, here outside any tool call)


def test_with_no_later_return_the_kill_lands_after_the_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(langgraph_race, "LATE_HOLD_S", 0.05)
    kills: list[tuple[str, int]] = []
    window: dict[str, str] = {}
    late_kill(lambda name, n: kills.append((name, n)), window)("langgraph.late_put_writes", 3)
    assert kills == [("langgraph.late_put_writes", 3)]
    assert window == {} and not late_kill_held()
    crash_point("tool.after_return")  # (no longer held: a call returning after the kill goes on)
