"""Persistence (F2): the SQLite store on real files, read back with the sqlite3 module."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from agentik.core.db import Database, DatabaseInUse
from agentik.core.llm import HistoryItem
from agentik.core.store import MemoryStore, SqliteStore, utcnow
from agentik.core.types import ConversationInfo, InvalidInput, Message


@pytest.fixture
async def store(tmp_path):
    s = SqliteStore(Database(str(tmp_path / "nested" / "dir" / "s.db")))
    await s.open()
    yield s
    await s.close()


def conv(cid: str = "c1") -> ConversationInfo:
    now = utcnow()
    return ConversationInfo(cid, None, False, now, now)


def msg(mid: str, kind: str = "user", cid: str = "c1", **payload) -> Message:
    return Message(mid, cid, kind, utcnow(), payload)


async def test_creates_missing_folders_and_uses_wal(store, tmp_path):
    path = tmp_path / "nested" / "dir" / "s.db"
    assert path.exists()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"conversation", "message", "working_memory"} <= tables


async def test_append_is_committed_when_it_returns(store, tmp_path):
    await store.create_conversation(conv())
    await store.append("c1", [msg("m1", body="x")])
    # another connection sees it at once: the write was committed, not just queued
    with sqlite3.connect(tmp_path / "nested" / "dir" / "s.db") as raw:
        assert raw.execute("SELECT id, kind FROM message").fetchall() == [("m1", "user")]


async def test_message_log_is_append_only(store, tmp_path):
    await store.create_conversation(conv())
    await store.append("c1", [msg("m1")])
    with (
        sqlite3.connect(tmp_path / "nested" / "dir" / "s.db") as raw,
        pytest.raises(sqlite3.IntegrityError, match="append-only"),
    ):
        raw.execute("UPDATE message SET kind = 'assistant'")


async def test_paging_with_after_offset_and_limit(store):
    await store.create_conversation(conv())
    await store.append("c1", [msg(f"m{i}") for i in range(10)])
    assert [m.id for m in await store.list_messages("c1", None, 0, 3)] == ["m0", "m1", "m2"]
    assert [m.id for m in await store.list_messages("c1", None, 8, 5)] == ["m8", "m9"]
    assert [m.id for m in await store.list_messages("c1", "m6", 0, 50)] == ["m7", "m8", "m9"]
    assert [m.id for m in await store.list_messages("c1", "m6", 1, 1)] == ["m8"]
    with pytest.raises(InvalidInput):
        await store.list_messages("c1", "nope", 0, 5)


async def test_working_memory_append_list_clear_and_rollback(store):
    await store.create_conversation(conv())
    await store.append(
        "c1", memory=[HistoryItem("user", "a"), HistoryItem("assistant", "b")], turn_id="t1"
    )
    await store.append(
        "c1",
        memory=[
            HistoryItem("user", "c"),
            HistoryItem("tool_call", call_id="x", tool_name="f", args_json="{}"),
        ],
        turn_id="t2",
    )
    rows = await store.list_memory("c1")
    assert [r.order_idx for r in rows] == [0, 1, 2, 3]
    assert rows[3].item == HistoryItem("tool_call", call_id="x", tool_name="f", args_json="{}")
    await store.fail_turn("c1", "t2", msg("e2", "error", message="boom"))
    assert [r.item.text for r in await store.list_memory("c1")] == ["a", "b"]
    assert [m.kind for m in await store.list_messages("c1", None, 0, 5)] == ["error"]
    await store.clear_memory("c1")
    assert await store.list_memory("c1") == []


async def test_compact_is_atomic_and_keeps_order(store):
    await store.create_conversation(conv())
    await store.append("c1", memory=[HistoryItem("user", str(i)) for i in range(6)])
    await store.compact_memory("c1", 4, HistoryItem("summary", "S"))
    rows = await store.list_memory("c1")
    assert [(r.item.role, r.item.text) for r in rows] == [
        ("summary", "S"),
        ("user", "4"),
        ("user", "5"),
    ]
    await store.append("c1", memory=[HistoryItem("user", "6")])
    assert [r.item.text for r in await store.list_memory("c1")][-1] == "6"


async def test_delete_cascades(store, tmp_path):
    await store.create_conversation(conv())
    await store.append("c1", [msg("m1")], [HistoryItem("user", "a")])
    assert await store.delete_conversation("c1")
    assert not await store.delete_conversation("c1")
    with sqlite3.connect(tmp_path / "nested" / "dir" / "s.db") as raw:
        assert raw.execute("SELECT count(*) FROM message").fetchone()[0] == 0
        assert raw.execute("SELECT count(*) FROM working_memory").fetchone()[0] == 0


async def test_a_failed_transaction_writes_nothing(store):
    await store.create_conversation(conv())
    with pytest.raises(Exception, match="UNIQUE"):
        await store.append("c1", [msg("m1"), msg("m1")], [HistoryItem("user", "a")])
    assert await store.list_messages("c1", None, 0, 10) == []
    assert await store.list_memory("c1") == []


async def test_dangling_turns_and_token_stats(store):
    """A turn ends with an assistant or error record of its own; queued turns behind a
    finished one (u2 here was sent while u1 ran) are dangling too."""
    await store.create_conversation(conv("a"))
    await store.create_conversation(conv("b"))
    await store.append("a", [msg("u1", cid="a")], turn_id="u1")
    await store.append("a", [msg("u2", cid="a")], turn_id="u2")
    tokens = {"input": 10, "output": 4}
    await store.append("a", [msg("r1", "assistant", cid="a", tokens=tokens)], turn_id="u1")
    await store.append("a", [msg("u3", cid="a")], turn_id="u3")
    await store.append("b", [msg("u4", cid="b")], turn_id="u4")
    await store.fail_turn("b", "u4", msg("e4", "error", cid="b"))
    assert [(m.conversation_id, m.id) for m in await store.dangling_turns()] == [
        ("a", "u2"),
        ("a", "u3"),
    ]
    stats = await store.token_stats()
    assert (stats.turns, stats.input, stats.output, stats.uncounted) == (1, 10, 4, 0)
    assert (await store.token_stats("b")).turns == 0
    unknown = {"input": None, "output": None}
    await store.append("a", [msg("r3", "assistant", cid="a", tokens=unknown)], turn_id="u3")
    stats = await store.token_stats()
    assert (stats.turns, stats.input, stats.output, stats.uncounted) == (2, 10, 4, 1)


async def test_concurrent_writers_never_see_database_is_locked(store):
    await store.create_conversation(conv())
    await asyncio.gather(*(store.append("c1", [msg(f"m{i}")]) for i in range(200)))
    assert len(await store.list_messages("c1", None, 0, 500)) == 200


async def test_in_memory_database_works(tmp_path):
    s = SqliteStore(Database(":memory:"))
    await s.open()
    await s.create_conversation(conv())
    await s.append("c1", [msg("m1")])
    assert len(await s.list_messages("c1", None, 0, 5)) == 1
    await s.close()


async def test_memory_store_matches_sqlite_semantics():
    s = MemoryStore()
    await s.create_conversation(conv())
    await s.append("c1", [msg(f"m{i}") for i in range(4)], [HistoryItem("user", "a")], turn_id="t")
    assert [m.id for m in await s.list_messages("c1", "m1", 0, 10)] == ["m2", "m3"]
    await s.compact_memory("c1", 1, HistoryItem("summary", "S"))
    assert [r.item.role for r in await s.list_memory("c1")] == ["summary"]
    await s.fail_turn("c1", "t", msg("e", "error"))
    assert len(await s.list_memory("c1")) == 1
    assert (await s.list_messages("c1", None, 0, 10))[-1].kind == "error"


async def test_a_durable_append_leaves_the_connection_in_normal_mode(store):
    await store.create_conversation(conv())
    modes = []
    await store.append("c1", [msg("m1")], durable=True)
    modes.append(await store.db.read(lambda: store.db.execute("PRAGMA synchronous").fetchone()[0]))
    assert modes == [1]  # NORMAL again: only the acknowledged write paid for the fsync
    assert [m.id for m in await store.list_messages("c1", None, 0, 5)] == ["m1"]


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
async def test_recent_turns_starts_at_a_user_message(store, kind):
    s = store if kind == "sqlite" else MemoryStore()
    await s.create_conversation(conv())
    await s.create_conversation(conv("c2"))
    await s.append("c2", [msg("other", cid="c2")])
    records = []
    for t in range(3):
        records += [msg(f"u{t}"), msg(f"tc{t}", "tool_call"), msg(f"a{t}", "assistant")]
    await s.append("c1", records)
    assert [m.id for m in await s.recent_turns("c1", 2)] == ["u1", "tc1", "a1", "u2", "tc2", "a2"]
    assert len(await s.recent_turns("c1", 3)) == 9
    assert len(await s.recent_turns("c1", 30)) == 9  # fewer turns than asked: all of them
    assert [m.id for m in await s.recent_turns("c1", 1)] == ["u2", "tc2", "a2"]
    assert await s.recent_turns("nobody", 5) == []


async def test_durable_writes_share_fsyncs_and_each_waits_for_one_after_its_commit(tmp_path):
    db = Database(str(tmp_path / "g.db"))
    await db.open([])
    real_sync = db._sync_wal
    committed: list[int] = []
    synced: list[int] = []  # for each finished fsync: how many commits it started after

    def slow_sync() -> None:
        start = len(committed)
        time.sleep(0.03)
        real_sync()
        synced.append(start)

    db._sync_wal = slow_sync

    async def write(i: int) -> None:
        await asyncio.sleep(i * 0.004)  # arrivals spread over several fsyncs
        await db.write(lambda: committed.append(i), durable=True)
        position = committed.index(i) + 1
        assert any(start >= position for start in synced), "returned before its fsync"

    await asyncio.gather(*(write(i) for i in range(60)))
    assert len(committed) == 60
    assert 2 <= len(synced) <= 15  # shared: far fewer fsyncs than writes
    await db.close()


def test_a_durable_write_needs_no_new_file_descriptor(tmp_path):
    """Under descriptor exhaustion (EMFILE) an acknowledged write still completes: the WAL is
    fsynced through a descriptor opened at start-up, never opened by name after the commit."""
    script = f"""
import asyncio, os, resource
from agentik.core.db import Database, DatabaseInUse
from agentik.core.store import SqliteStore, utcnow
from agentik.core.types import ConversationInfo, Message

async def main():
    store = SqliteStore(Database({str(tmp_path / "fd.db")!r}))
    await store.open()
    now = utcnow()
    await store.create_conversation(ConversationInfo("c", None, False, now, now))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError as e:
        assert e.errno == 24, e  # EMFILE: no descriptor left
    await store.append("c", [Message("m1", "c", "user", now, {{}})], durable=True)
    for fd in held:
        os.close(fd)
    print("stored", [m.id for m in await store.list_messages("c", None, 0, 5)])
    await store.close()

asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "stored ['m1']" in out.stdout


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
async def test_turn_end_is_the_record_that_closed_a_turn(tmp_path, kind):
    store = SqliteStore(Database(str(tmp_path / "t.db"))) if kind == "sqlite" else MemoryStore()
    await store.open()
    now = utcnow()
    await store.create_conversation(ConversationInfo("c", None, False, now, now))
    for turn in ("u1", "u2"):
        await store.add_user_message(Message(turn, "c", "user", now, {"content": []}))
    assert await store.turn_end("u1") is None  # still running or waiting
    await store.append(
        "c", [Message("a1", "c", "assistant", now, {"text": "hi"})], turn_id="u1", touch=now
    )
    await store.fail_turn("c", "u2", Message("e2", "c", "error", now, {"message": "boom"}))
    assert (await store.turn_end("u1")).payload == {"text": "hi"}
    assert (await store.turn_end("u2")).kind == "error"
    await store.close()


async def test_one_database_object_at_a_time_per_file_and_memory_is_exempt(tmp_path):
    first = SqliteStore(Database(str(tmp_path / "one.db")))
    await first.open()
    second = SqliteStore(Database(str(tmp_path / "one.db")))
    with pytest.raises(DatabaseInUse, match=rf"in use by another process \(pid {os.getpid()}\)"):
        await second.open()
    await first.close()  # released: now it opens
    await second.open()
    await second.close()
    a, b = SqliteStore(Database(":memory:")), SqliteStore(Database(":memory:"))
    await a.open()
    await b.open()
    await a.close()
    await b.close()


def test_the_lock_dies_with_its_process(tmp_path):
    """kill -9 leaves no stale lock: the OS drops it with the process."""
    path = tmp_path / "held.db"
    script = f"""
import asyncio, sys
from agentik.core.db import Database
from agentik.core.store import SqliteStore

async def main():
    await SqliteStore(Database({str(path)!r})).open()
    print("open", flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "open\n"

        async def try_open() -> None:
            store = SqliteStore(Database(str(path)))
            await store.open()
            await store.close()

        with pytest.raises(DatabaseInUse, match=f"pid {holder.pid}"):
            asyncio.run(try_open())
        holder.kill()
        holder.wait(10)
        asyncio.run(try_open())
    finally:
        holder.kill()
        holder.wait(10)
