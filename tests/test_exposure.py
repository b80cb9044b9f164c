"""The exposure estimate: each tool's in-flight and after-return windows, measured from the clean runs' execution
log, and the duplicates per million calls they mean at a crash rate."""

from __future__ import annotations

import pytest

from pytest_replaysafe.judge.evidence import Entry
from pytest_replaysafe.judge.exposure import parse_rate, summarize, windows
from tests.test_plugin import report, run, write

pytest_plugins = ["pytester"]


@pytest.mark.parametrize(
    ("text", "per_second"),
    [("1/day", 1 / 86400), ("3/week", 3 / (7 * 86400)), ("1/12h", 1 / 43200), ("2/min", 2 / 60), ("1/days", 1 / 86400)],
)
def test_crash_rates_are_read_per_period(text: str, per_second: float) -> None:
    assert parse_rate(text) == pytest.approx(per_second)


@pytest.mark.parametrize("text", ["daily", "1/fortnight", "-1/day", "1/"])
def test_a_rate_that_is_not_one_is_refused_with_the_forms_it_takes(text: str) -> None:
    with pytest.raises(ValueError, match="1/day, 3/week, 1/12h"):
        parse_rate(text)


def test_windows_come_from_start_return_and_durable_record() -> None:
    entries = [
        Entry("t", "m:a", "start", "refund", call="m:0", t=10.0),
        Entry("t", "m:b", "start", "email", call="m:1", t=10.1),
        Entry("t", "m:a", "end", "refund", call="m:0", t=10.5),
        Entry("t", "m:a", "record", "refund", t=10.55),  # the write begins (after a turn wait): not yet durable
        Entry("t", "m:a", "recorded", "refund", t=10.6),
        Entry("t", "m:b", "end", "email", call="m:1", t=11.0),  # returned, never recorded: left out
    ]
    found = windows(entries)
    assert list(found) == ["refund"] and found["refund"][0] == pytest.approx((0.5, 0.05))  # the write, not the wait
    rows = summarize([{"backend": "sqlite", "windows": found}], parse_rate("1/day"))
    assert rows == [
        {
            "tool": "refund",
            "backend": "sqlite",
            "calls": 1,
            "in_flight_ms": 500.0,
            "after_return_ms": pytest.approx(50.0),
            "duplicates_per_million_calls": pytest.approx(1e6 * 0.55 / 86400, rel=1e-4),
        }
    ]


def test_the_report_carries_each_tools_exposure_at_the_rate_given(pytester: pytest.Pytester) -> None:
    from tests.test_plugin import PROTECTED

    write(pytester, PROTECTED)
    daily = run(pytester, "--crash-matrix", "--crash-report=matrix.json", "--crash-modes=inprocess")
    daily.assert_outcomes(passed=6)
    rows = report(pytester, daily)["exposure"]
    assert rows["rate"] == "1/day" and {r["tool"] for r in rows["rows"]} == {"refund_order"}
    assert all(r["calls"] >= 3 and r["in_flight_ms"] > 0 and r["after_return_ms"] > 0 for r in rows["rows"])
    daily.stdout.fnmatch_lines(["exposure at 1/day crashes per process*", "*refund_order*sqlite*"])
    for r in rows["rows"]:
        windows_s = (r["in_flight_ms"] + r["after_return_ms"]) / 1000
        assert r["duplicates_per_million_calls"] == pytest.approx(1e6 * windows_s / 86400, rel=1e-3)
    bad = run(pytester, "--crash-matrix", "--crash-rate=sometimes")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--crash-rate*'sometimes'*1/day, 3/week*"])
