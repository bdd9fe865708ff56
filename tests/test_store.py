"""Persistence (F2): what the SQLite store does beyond the store contract (tests/store_contract.py),
on real files read back with the sqlite3 module: WAL, fsyncs, the append-only log, migration."""

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
from agentik.core.store import SqliteStore, utcnow
from agentik.core.turns import TurnState
from agentik.core.types import ConversationInfo, Message


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


async def test_in_memory_database_works(tmp_path):
    s = SqliteStore(Database(":memory:"))
    await s.open()
    await s.create_conversation(conv())
    await s.append("c1", [msg("m1")])
    assert len(await s.list_messages("c1", None, 0, 5)) == 1
    await s.close()


async def test_a_durable_append_leaves_the_connection_in_normal_mode(store):
    await store.create_conversation(conv())
    modes = []
    await store.append("c1", [msg("m1")], durable=True)
    modes.append(await store.db.read(lambda: store.db.execute("PRAGMA synchronous").fetchone()[0]))
    assert modes == [1]  # NORMAL again: only the acknowledged write paid for the fsync
    assert [m.id for m in await store.list_messages("c1", None, 0, 5)] == ["m1"]


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


OLD_SCHEMA = """
CREATE TABLE conversation (id TEXT PRIMARY KEY, title TEXT, created_at TEXT, updated_at TEXT);
CREATE TABLE message (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE,
  conversation_id TEXT, kind TEXT, turn_id TEXT, created_at TEXT, payload_json TEXT);
CREATE TABLE working_memory (id INTEGER PRIMARY KEY, conversation_id TEXT, order_idx INTEGER,
  turn_id TEXT, role TEXT, payload_json TEXT, created_at TEXT);
CREATE TABLE idempotency_key (conversation_id TEXT, key TEXT, message_id TEXT,
  PRIMARY KEY (conversation_id, key));
"""


async def test_a_database_from_before_the_turn_table_gets_its_turns(tmp_path):
    """Every user message becomes a turn whose state its records tell: done, interrupted
    (cancelled), failed, cancelled before it started, cut while running (steps in working
    memory) or never started; the idempotency keys move onto the turns."""
    path = tmp_path / "old.db"
    t = utcnow().isoformat()
    user = '{"content": [{"type": "text", "body": "hi"}]}'
    with sqlite3.connect(path) as raw:
        raw.executescript(OLD_SCHEMA)
        raw.execute("INSERT INTO conversation VALUES ('c', NULL, ?, ?)", (t, t))
        ends = {
            "u1": ("assistant", '{"text": "ok"}'),
            "u2": ("assistant", '{"text": "o", "interrupted": true}'),
            "u3": ("error", '{"message": "boom", "code": "http_500"}'),
            "u4": ("error", '{"message": "no", "code": "cancelled"}'),
        }
        for n in range(1, 7):
            uid = f"u{n}"
            raw.execute(
                "INSERT INTO message (id, conversation_id, kind, turn_id, created_at, "
                "payload_json) VALUES (?, 'c', 'user', ?, ?, ?)",
                (uid, uid, t, user),
            )
            if uid in ends:
                kind, payload = ends[uid]
                raw.execute(
                    "INSERT INTO message (id, conversation_id, kind, turn_id, created_at, "
                    "payload_json) VALUES (?, 'c', ?, ?, ?, ?)",
                    (f"end-{uid}", kind, uid, t, payload),
                )
        raw.execute(
            "INSERT INTO working_memory (conversation_id, order_idx, turn_id, role, "
            "payload_json, created_at) VALUES ('c', 0, 'u5', 'tool_call', '{}', ?)",
            (t,),
        )
        raw.execute("INSERT INTO idempotency_key VALUES ('c', 'key-1', 'u1')")
    store = SqliteStore(Database(str(path)))
    await store.open()
    states = {n: (await store.get_turn(f"u{n}")).state for n in range(1, 7)}
    assert states == {
        1: TurnState.DONE,
        2: TurnState.CANCELLED,
        3: TurnState.FAILED,
        4: TurnState.CANCELLED,
        5: TurnState.RUNNING,
        6: TurnState.QUEUED,
    }
    assert [r.id for r in await store.open_turns()] == ["u5", "u6"]
    retry = await store.add_user_message(
        Message("again", "c", "user", utcnow(), {}), idempotency_key="key-1"
    )
    assert retry.id == "u1" and retry.state is TurnState.DONE
    await store.close()
    with sqlite3.connect(path) as raw:
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "idempotency_key" not in tables and "turn" in tables
    store = SqliteStore(Database(str(path)))  # and once more: nothing is done twice
    await store.open()
    assert len(await store.open_turns()) == 2
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
