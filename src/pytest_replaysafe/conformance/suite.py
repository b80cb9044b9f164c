"""The checkpointer contract as a test class. Subclass it with a ``checkpointer`` fixture to test a backend::

    from pytest_replaysafe.conformance import CheckpointerConformance

    class TestMyCheckpointer(CheckpointerConformance):
        @pytest.fixture
        def checkpointer(self):
            cp = MyCheckpointer(...)
            yield cp
            cp.close()

Every test uses a fresh thread id, so a shared database is fine. The run lock's tests
(:mod:`.lock`) ask a backend whose lock can be lost while its process lives for more: a
``second_worker`` fixture (the same storage, opened as another worker would), a ``blip`` fixture and ``lease_s``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest

from pytest_replaysafe.conformance.lock import RunLockConformance
from pytest_replaysafe.conformance.lock import new_thread_id as _tid
from tenxgraph.state.messages import Message, ToolCallBlock
from tenxgraph.storage.checkpointer.base import BaseCheckpointer
from tenxgraph.utils.errors import SerializationError, StaleStateError
from tenxgraph.utils.sync import run_sync


class CheckpointerConformance(RunLockConformance):
    """Contract tests every checkpointer must pass."""

    @pytest.fixture
    def checkpointer(self) -> BaseCheckpointer:  # pragma: no cover - subclasses provide it
        raise NotImplementedError("subclass CheckpointerConformance and define a 'checkpointer' fixture")

    # -- thread state -----------------------------------------------------------------------------------
    def test_missing_thread_is_none(self, checkpointer: BaseCheckpointer) -> None:
        assert checkpointer.get_thread(_tid()) is None
        assert checkpointer.list_messages(_tid()) == []

    def test_state_round_trip_and_versions(self, checkpointer: BaseCheckpointer) -> None:
        tid = _tid()
        values: dict[str, Any] = {
            "meta": {"current_node": "MAIN", "step": 0},
            "note": "ünïcode ✓",
            "n": [1, 2.5],
        }
        assert checkpointer.put_thread(tid, values, expected_version=0) == 1
        snap = checkpointer.get_thread(tid)
        assert snap is not None and snap.version == 1 and snap.values == values and snap.thread_id == tid
        values["n"] = [3]
        assert checkpointer.put_thread(tid, values, expected_version=1) == 2
        snap = checkpointer.get_thread(tid)
        assert snap is not None and (snap.version, snap.values["n"]) == (2, [3])

    def test_compare_and_swap_rejects_stale_version(self, checkpointer: BaseCheckpointer) -> None:
        tid = _tid()
        checkpointer.put_thread(tid, {"a": 1}, expected_version=0)
        checkpointer.put_thread(tid, {"a": 2}, expected_version=1)
        with pytest.raises(StaleStateError) as info:
            checkpointer.put_thread(tid, {"a": "stale"}, expected_version=1, new_messages=[Message.user("lost")])
        assert (info.value.expected, info.value.actual) == (1, 2)
        snap = checkpointer.get_thread(tid)
        assert snap is not None and snap.values == {"a": 2} and snap.version == 2
        assert checkpointer.list_messages(tid) == []  # the loser's messages were not stored either
        with pytest.raises(StaleStateError):
            checkpointer.put_thread(_tid(), {"a": 1}, expected_version=3)  # thread does not exist: version 0

    def test_state_is_copied_in_and_out(self, checkpointer: BaseCheckpointer) -> None:
        tid = _tid()
        values: dict[str, Any] = {"items": [1]}
        checkpointer.put_thread(tid, values, expected_version=0)
        values["items"].append(2)
        snap = checkpointer.get_thread(tid)
        assert snap is not None and snap.values == {"items": [1]}
        snap.values["items"].append(3)
        again = checkpointer.get_thread(tid)
        assert again is not None and again.values == {"items": [1]}

    def test_unserialisable_state_is_a_clear_error(self, checkpointer: BaseCheckpointer) -> None:
        tid = _tid()
        with pytest.raises(SerializationError, match="thread"):
            checkpointer.put_thread(tid, {"bad": object()}, expected_version=0)
        assert checkpointer.get_thread(tid) is None

    # -- messages ---------------------------------------------------------------------------------------
    def test_messages_are_appended_atomically_and_deduplicated(self, checkpointer: BaseCheckpointer) -> None:
        tid = _tid()
        first = Message.user("refund order 1042")
        call = Message.assistant("", [ToolCallBlock("call_1", "refund", {"order": "1042"})])
        checkpointer.put_thread(tid, {}, expected_version=0, new_messages=[first])
        checkpointer.put_thread(tid, {}, expected_version=1, new_messages=[first, call])
        checkpointer.append_messages(tid, [call])
        stored = checkpointer.list_messages(tid)
        assert stored == [first, call]
        assert [m.message_id for m in stored] == [first.message_id, call.message_id]
        assert stored[1].tool_calls[0].args == {"order": "1042"}
        snap = checkpointer.get_thread(tid)
        assert snap is not None and snap.version == 2  # append_messages does not bump the version

    def test_messages_after_a_sequence_number(self, checkpointer: BaseCheckpointer) -> None:
        """Optional (None: runs read whole logs). Rows after a seq, in order, with the count and highest seq;
        numbers grow and are not reused when a thread is deleted and made again."""
        tid = _tid()
        if run_sync(checkpointer.alist_messages_after(tid, 0)) is None:
            pytest.skip("this checkpointer keeps no message sequence numbers")
        empty = run_sync(checkpointer.alist_messages_after(tid, 0))
        assert empty is not None and (empty.rows, empty.count, empty.last_seq) == ([], 0, 0)
        first = [Message.user(f"m{i}") for i in range(3)]
        checkpointer.put_thread(tid, {"meta": {}}, expected_version=0, new_messages=first)
        whole = run_sync(checkpointer.alist_messages_after(tid, 0))
        assert whole is not None and [m for _, m in whole.rows] == first and whole.count == 3
        seqs = [seq for seq, _ in whole.rows]
        assert seqs == sorted(seqs) and len(set(seqs)) == 3 and whole.last_seq == seqs[-1]
        more = [Message.user("m3")]
        checkpointer.append_messages(tid, [*first, *more])  # stored ids are skipped
        after = run_sync(checkpointer.alist_messages_after(tid, whole.last_seq))
        assert after is not None and [m for _, m in after.rows] == more and after.count == 4
        assert after.rows[0][0] > whole.last_seq == seqs[-1]
        checkpointer.delete_thread(tid)
        checkpointer.put_thread(tid, {"meta": {}}, expected_version=0, new_messages=first)
        again = run_sync(checkpointer.alist_messages_after(tid, 0))
        assert again is not None and again.count == 3 and min(seq for seq, _ in again.rows) > after.last_seq

    def test_messages_of_threads_are_separate(self, checkpointer: BaseCheckpointer) -> None:
        a, b = _tid(), _tid()
        shared = Message.user("same id on two threads")
        checkpointer.append_messages(a, [shared])
        checkpointer.append_messages(b, [shared, Message.user("only b")])
        assert len(checkpointer.list_messages(a)) == 1
        assert len(checkpointer.list_messages(b)) == 2

    # -- ledger -----------------------------------------------------------------------------------------
    def test_ledger_round_trip(self, checkpointer: BaseCheckpointer) -> None:
        tid = _tid()
        key = f"msg_{uuid.uuid4().hex}:call_1"
        record = {"v": 1, "output": {"refund": "R-1", "amount": 20.5}, "is_error": False, "update": None}
        assert checkpointer.get_tool_results(tid, [key]) == {}
        assert checkpointer.put_tool_result(tid, key, record) is True
        assert checkpointer.get_tool_results(tid, [key]) == {key: record}
        assert checkpointer.list_tool_results(tid) == {key: record}

    def test_ledger_first_write_wins(self, checkpointer: BaseCheckpointer) -> None:
        tid = _tid()
        assert checkpointer.put_tool_result(tid, "m:c", {"output": "first"}) is True
        assert checkpointer.put_tool_result(tid, "m:c", {"output": "second"}) is False
        assert checkpointer.get_tool_results(tid, ["m:c"]) == {"m:c": {"output": "first"}}

    def test_ledger_first_write_wins_under_concurrency(self, checkpointer: BaseCheckpointer) -> None:
        tid = _tid()

        async def race() -> list[bool]:
            return list(
                await asyncio.gather(*(checkpointer.aput_tool_result(tid, "m:c", {"output": i}) for i in range(8)))
            )

        wins = run_sync(race())
        assert wins.count(True) == 1
        stored = checkpointer.get_tool_results(tid, ["m:c"])["m:c"]
        assert stored == {"output": wins.index(True)}

    def test_ledger_group_write(self, checkpointer: BaseCheckpointer) -> None:
        """Several records in one write: each as a single write would be (first wins, an intent is replaced), and an
        unstorable one gets its SerializationError in its place without failing the others."""
        tid = _tid()
        checkpointer.put_tool_result(tid, "m:old", {"output": "first"})
        checkpointer.put_tool_intent(tid, "m:intent", {"kind": "intent"})
        records: list[tuple[str, dict[str, Any]]] = [
            ("m:old", {"output": "second"}),
            ("m:intent", {"output": "done"}),
            ("m:bad", {"output": "nul \x00"}),
            ("m:new", {"output": 3}),
        ]
        out = run_sync(checkpointer.aput_tool_results(tid, records))
        assert out[:2] == [False, True] and isinstance(out[2], SerializationError) and out[3] is True
        stored = checkpointer.list_tool_results(tid)
        assert stored == {"m:old": {"output": "first"}, "m:intent": {"output": "done"}, "m:new": {"output": 3}}
        assert run_sync(checkpointer.aput_tool_results(tid, [])) == []

    def test_ledger_records_are_copies(self, checkpointer: BaseCheckpointer) -> None:
        tid = _tid()
        record: dict[str, Any] = {"output": {"items": [1]}}
        checkpointer.put_tool_result(tid, "m:c", record)
        record["output"]["items"].append(2)
        got = checkpointer.get_tool_results(tid, ["m:c"])["m:c"]
        assert got == {"output": {"items": [1]}}
        got["output"]["items"].append(3)
        assert checkpointer.get_tool_results(tid, ["m:c"])["m:c"] == {"output": {"items": [1]}}

    def test_ledger_batched_read_returns_only_present_keys(self, checkpointer: BaseCheckpointer) -> None:
        tid = _tid()
        keys = [f"m:call_{i}" for i in range(1200)]  # more than one SQL IN-list chunk
        for key in keys[::3]:
            checkpointer.put_tool_result(tid, key, {"output": key})
        found = checkpointer.get_tool_results(tid, [*keys, "absent:1"])
        assert set(found) == set(keys[::3])
        assert all(found[k] == {"output": k} for k in found)
        assert checkpointer.get_tool_results(tid, []) == {}

    def test_ledger_is_per_thread_and_keys_are_not_truncated(self, checkpointer: BaseCheckpointer) -> None:
        a, b = _tid(), _tid()
        long_key = "msg_" + "x" * 3000 + ":call_1"
        checkpointer.put_tool_result(a, long_key, {"output": 1})
        assert checkpointer.get_tool_results(b, [long_key]) == {}
        assert checkpointer.get_tool_results(a, [long_key]) == {long_key: {"output": 1}}
        assert checkpointer.get_tool_results(a, [long_key[:-1]]) == {}

    def test_unserialisable_record_is_a_clear_error(self, checkpointer: BaseCheckpointer) -> None:
        tid = _tid()
        with pytest.raises(SerializationError, match="m:c"):
            checkpointer.put_tool_result(tid, "m:c", {"output": {1, 2}})
        assert checkpointer.get_tool_results(tid, ["m:c"]) == {}

    def test_intent_is_replaced_by_the_result_and_never_replaces_one(self, checkpointer: BaseCheckpointer) -> None:
        tid = _tid()
        intent = {"v": 1, "kind": "intent", "tool": "refund"}
        assert checkpointer.put_tool_intent(tid, "m:c", intent) is True
        assert checkpointer.put_tool_intent(tid, "m:c", {"kind": "intent", "other": 1}) is False  # first wins
        assert checkpointer.get_tool_results(tid, ["m:c"]) == {"m:c": intent}
        assert checkpointer.put_tool_result(tid, "m:c", {"kind": "value", "output": "done"}) is True  # upgrades
        assert checkpointer.put_tool_result(tid, "m:c", {"kind": "value", "output": "again"}) is False
        assert checkpointer.put_tool_intent(tid, "m:c", intent) is False  # never replaces a result
        assert checkpointer.get_tool_results(tid, ["m:c"]) == {"m:c": {"kind": "value", "output": "done"}}

    # -- retention --------------------------------------------------------------------------------------
    def test_prune_keeps_young_records_and_records_of_resumable_threads(self, checkpointer: BaseCheckpointer) -> None:
        done, running, failed = _tid(), _tid(), _tid()
        for tid, status in ((done, "done"), (running, "running"), (failed, "error")):
            checkpointer.put_thread(tid, {"meta": {"status": status, "current_node": None}}, expected_version=0)
            for i in range(5):
                checkpointer.put_tool_result(tid, f"m:call_{i}", {"output": i})
        orphan = _tid()  # a thread whose state another framework keeps (LangGraph): kept until vouched finished
        checkpointer.put_tool_result(orphan, "m:c", {"output": 1})
        time.sleep(0.01)  # every record is now strictly older than "now"
        assert checkpointer.prune_tool_executions(timedelta(hours=1)) == 0
        assert len(checkpointer.list_tool_results(done)) == 5
        removed = checkpointer.prune_tool_executions(timedelta(0), batch_size=2)  # several batches
        assert removed >= 5  # other tests' finished threads may share this store
        assert checkpointer.list_tool_results(done) == {}
        assert len(checkpointer.list_tool_results(running)) == 5  # a resumable run keeps its ledger
        assert len(checkpointer.list_tool_results(failed)) == 5
        assert len(checkpointer.list_tool_results(orphan)) == 1  # a thread it cannot see finished, too
        assert checkpointer.prune_tool_executions(timedelta(0), finished=[orphan, running]) >= 6
        assert checkpointer.list_tool_results(orphan) == {} and checkpointer.list_tool_results(running) == {}
        assert checkpointer.prune_tool_executions(timedelta(0), include_resumable=True) >= 5
        assert checkpointer.list_tool_results(failed) == {}

    def test_prune_arguments_are_checked(self, checkpointer: BaseCheckpointer) -> None:
        with pytest.raises(ValueError, match="older_than must be a timedelta >= 0"):
            checkpointer.prune_tool_executions(timedelta(seconds=-1))
        with pytest.raises(ValueError, match="batch_size must be"):
            checkpointer.prune_tool_executions(timedelta(0), batch_size=0)
        with pytest.raises(ValueError, match=r"finished must be a list of thread ids, got the string 't1'"):
            checkpointer.prune_tool_executions(timedelta(0), finished="t1")

    def test_delete_thread_removes_everything(self, checkpointer: BaseCheckpointer) -> None:
        tid, other = _tid(), _tid()
        for t in (tid, other):
            checkpointer.put_thread(t, {"x": 1}, expected_version=0, new_messages=[Message.user("hi")])
            checkpointer.put_tool_result(t, "m:c", {"output": 1})
        checkpointer.delete_thread(tid)
        assert checkpointer.get_thread(tid) is None
        assert checkpointer.list_messages(tid) == []
        assert checkpointer.list_tool_results(tid) == {}
        assert checkpointer.get_thread(other) is not None  # other threads untouched
        assert checkpointer.list_tool_results(other) != {}

    def test_invalid_thread_id_is_rejected(self, checkpointer: BaseCheckpointer) -> None:
        with pytest.raises(ValueError, match="thread_id"):
            checkpointer.get_thread("")

    # -- optional capabilities: skipped where the checkpointer says it has none ----------------------------
    def test_interrupted_threads_are_listed(self, checkpointer: BaseCheckpointer) -> None:
        running, done = _tid(), _tid()
        checkpointer.put_thread(running, {"meta": {"status": "running"}}, expected_version=0)
        checkpointer.put_thread(done, {"meta": {"status": "done"}}, expected_version=0)
        try:
            listed = checkpointer.list_interrupted_threads(100_000)
        except NotImplementedError:
            pytest.skip("this checkpointer cannot list interrupted threads (server recovery is off for it)")
        assert running in listed and done not in listed

    def test_a_transaction_commits_the_work_with_its_record_or_neither(self, checkpointer: BaseCheckpointer) -> None:
        kind = checkpointer.transactions
        if kind is None:
            pytest.skip("this checkpointer cannot run a tool in the ledger's transaction")
        tid, record = _tid(), {"v": 2, "kind": "value", "tool": "t", "output": "done"}

        def work(conn: Any) -> Any:
            async def later() -> Any:
                return record

            return later() if kind == "async" else record

        def failing(conn: Any) -> Any:
            raise RuntimeError("the tool failed")

        with pytest.raises(RuntimeError, match="the tool failed"):
            run_sync(checkpointer.atransact(tid, "m:c", failing))
        assert checkpointer.list_tool_results(tid) == {}  # rolled back: no record
        stored, wrote = run_sync(checkpointer.atransact(tid, "m:c", work))
        assert wrote and stored["output"] == "done"
        assert checkpointer.get_tool_results(tid, ["m:c"])["m:c"]["output"] == "done"
        again, wrote = run_sync(checkpointer.atransact(tid, "m:c", failing))  # recorded: the work does not run
        assert not wrote and again["output"] == "done"
