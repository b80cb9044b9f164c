"""A turn reads only the messages stored since the last one (counted in rows, not timed), and the cache never
serves a log that changed under it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tenxgraph import Message, ReactAgent, Reply, ScriptedModel
from tenxgraph.core.graph.message_cache import MessageCache
from tenxgraph.storage.checkpointer import BaseCheckpointer, SqliteCheckpointer
from tenxgraph.storage.checkpointer.base import MessagesAfter
from tenxgraph.storage.checkpointer.delegating import DelegatingCheckpointer


class CountingReads(DelegatingCheckpointer):
    def __init__(self, inner: BaseCheckpointer) -> None:
        super().__init__(inner)
        self.rows = 0
        self.calls: list[int] = []  # after_seq of each incremental read

    async def alist_messages(self, thread_id: str) -> list[Message]:
        found = await super().alist_messages(thread_id)
        self.rows += len(found)
        return found

    async def alist_messages_after(self, thread_id: str, after_seq: int) -> MessagesAfter | None:
        found = await super().alist_messages_after(thread_id, after_seq)
        self.calls.append(after_seq)
        self.rows += len(found.rows) if found is not None else 0
        return found


def lookup(order_id: str) -> str:
    """Look up an order."""
    return f"order {order_id}: delivered"


def agent(cp: BaseCheckpointer) -> ReactAgent:
    model = ScriptedModel(
        [Reply(tool_calls=[("lookup", {"order_id": "7"})]), "Delivered."],
        turn_of=lambda messages: 0 if messages[-1].role == "user" else 1,
    )
    return ReactAgent(model, tools=[lookup])


def test_each_turn_reads_only_the_previous_turns_messages(checkpointer: BaseCheckpointer) -> None:
    counting = CountingReads(checkpointer)
    app = agent(counting).compile(checkpointer=counting)
    reads = []
    for turn in range(30):
        counting.rows = 0
        result = app.invoke({"messages": [Message.user(f"where is 7? ({turn})")]}, {"thread_id": "long"})
        reads.append(counting.rows)
        assert len(result.state.messages) == 4 * (turn + 1)  # user, call, result, answer per turn
    assert reads[0] == 0 and set(reads[1:]) == {4}  # the whole log would be 4 x turn rows
    app.message_cache = MessageCache(0)  # no cache: the count sees whole-log reads, so it can fail
    counting.rows = 0
    app.invoke({"messages": [Message.user("once more")]}, {"thread_id": "long"})
    assert counting.rows == 4 * 30


def test_messages_stored_by_another_writer_or_a_remade_thread_are_seen(checkpointer: BaseCheckpointer) -> None:
    app = agent(checkpointer).compile(checkpointer=checkpointer)
    app.invoke({"messages": [Message.user("first")]}, {"thread_id": "t"})
    other = Message.user("stored by someone else")
    checkpointer.append_messages("t", [other])  # no version change: only the count tells
    state = app.get_state("t")
    assert state is not None and state.messages[-1] == other and len(state.messages) == 5
    checkpointer.delete_thread("t")  # made again, same id, same number of messages
    app.invoke({"messages": [Message.user("second")]}, {"thread_id": "t"})
    checkpointer.append_messages("t", [Message.user("x")])
    state = app.get_state("t")
    assert state is not None and state.messages[0].text == "second" and len(state.messages) == 5


def test_a_log_that_is_not_an_extension_is_read_whole(tmp_path: Path) -> None:
    """When the kept messages plus the new rows do not make the thread's count (a message committed with a lower
    number than one already read, as concurrent PostgreSQL inserts can), the log is read whole again."""
    cp = SqliteCheckpointer(tmp_path / "s.db")
    counting = CountingReads(cp)
    cache = MessageCache()

    def insert(seq: int, text: str) -> None:
        with cp._tx() as conn:
            conn.execute(
                "INSERT INTO messages (seq, thread_id, message_id, data) VALUES (?, 't', ?, ?)",
                (seq, text, Message.user(text).to_json()),
            )

    cp.put_thread("t", {"meta": {}}, expected_version=0)
    insert(1, "a")
    insert(3, "c")
    assert [m.text for m in asyncio.run(cache.load(counting, "t"))] == ["a", "c"]  # kept up to seq 3
    insert(2, "b")  # committed late, below 3
    insert(4, "d")
    counting.calls.clear()
    assert [m.text for m in asyncio.run(cache.load(counting, "t"))] == ["a", "b", "c", "d"]
    assert counting.calls == [3, 0]  # the rows after 3 did not make the count: re-read from the start
    cp.close()


def test_a_copy_over_other_storage_shares_nothing(tmp_path: Path) -> None:
    one, two = SqliteCheckpointer(tmp_path / "1.db"), SqliteCheckpointer(tmp_path / "2.db")
    app = agent(one).compile(checkpointer=one)
    app.invoke({"messages": [Message.user("in one")]}, {"thread_id": "t"})
    two.put_thread("t", {"meta": {}}, expected_version=0, new_messages=[Message.user("in two")])
    state = app.copy(two).get_state("t")
    assert state is not None and [m.text for m in state.messages] == ["in two"]
    app.checkpointer = two  # swapped in place: the cache notices the other storage too
    state = app.get_state("t")
    assert state is not None and [m.text for m in state.messages] == ["in two"]
    one.close()
    two.close()


def test_max_threads_bounds_the_cache() -> None:
    with pytest.raises(ValueError, match="max_threads"):
        MessageCache(-1)
