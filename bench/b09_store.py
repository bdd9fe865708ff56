"""B9: a durable append and a read of the last 20 messages through agentik's store
(``SqliteStore`` on its ``Database``, which runs SQLite on the event loop and only the fsync of a
durable write on a thread) vs raw sqlite3 in the calling thread.

Same schema (bench/floors/schema.py is agentik's DDL), same pragmas (WAL, synchronous=NORMAL),
same row (a user message, JSON payload, ISO timestamp), one transaction per append. The read
is of a 1,000-message conversation; agentik's API pages oldest-first, so the last 20 are
``list_messages(cid, None, offset=980, limit=20)``; raw does ``ORDER BY seq DESC LIMIT 20``
(and, as a check, the same OFFSET query). CPU is process CPU (all threads) per op.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import common
from common import row, stats
from schema import begin, commit, connect

from agentik.core.db import Database
from agentik.core.store import SqliteStore
from agentik.core.types import ConversationInfo, Message

INSERT = (
    "INSERT INTO message (id, conversation_id, kind, turn_id, created_at, payload_json) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
PAYLOAD = {"content": [{"type": "text", "body": "hello, this is a benchmark message"}]}


def user_message(cid: str) -> Message:
    return Message(f"msg-{uuid.uuid4().hex}", cid, "user", datetime.now(UTC), PAYLOAD)


def raw_append(db: Any, cid: str, durable: bool = False) -> None:
    begin(db, durable)
    db.execute(
        INSERT,
        (
            f"msg-{uuid.uuid4().hex}",
            cid,
            "user",
            None,
            datetime.now(UTC).isoformat(),
            json.dumps(PAYLOAD, ensure_ascii=False),
        ),
    )
    commit(db, durable)


def raw_last20(db: Any, cid: str) -> list[tuple[Any, ...]]:
    rows = db.execute(
        "SELECT id, kind, created_at, payload_json FROM message WHERE conversation_id = ? "
        "ORDER BY seq DESC LIMIT 20",
        (cid,),
    ).fetchall()
    rows.reverse()
    return [(r[0], r[1], datetime.fromisoformat(r[2]), json.loads(r[3])) for r in rows]


def raw_offset20(db: Any, cid: str, offset: int) -> list[tuple[Any, ...]]:
    rows = db.execute(
        "SELECT id, kind, created_at, payload_json FROM message WHERE conversation_id = ? "
        "AND seq > 0 ORDER BY seq LIMIT 20 OFFSET ?",
        (cid, offset),
    ).fetchall()
    return [(r[0], r[1], datetime.fromisoformat(r[2]), json.loads(r[3])) for r in rows]


def new_raw_conversation(db: Any) -> str:
    cid, ts = f"conv-{uuid.uuid4().hex}", datetime.now(UTC).isoformat()
    db.execute(
        "INSERT INTO conversation (id, title, created_at, updated_at) VALUES (?,?,?,?)",
        (cid, None, ts, ts),
    )
    return cid


async def main(args: Any) -> dict[str, Any]:
    tmp = common.tmpdir()
    pid = os.getpid()
    reps = common.repeats(args, 7, 2)
    n_app = 200 if args.quick else 400
    n_read = 200 if args.quick else 400
    n_dur = 50 if args.quick else 100
    store = SqliteStore(Database(str(tmp / f"b9-{pid}.db")))
    await store.open()
    raw = connect(str(tmp / f"b9-raw-{pid}.db"))
    lean = connect(str(tmp / f"b9-lean-{pid}.db"), lean=True)
    now = datetime.now(UTC)
    cid = f"conv-{uuid.uuid4().hex}"
    await store.create_conversation(ConversationInfo(cid, None, False, now, now))
    rcid, lcid = new_raw_conversation(raw), new_raw_conversation(lean)
    pt, pc = time.process_time, time.perf_counter
    s: dict[str, list[float]] = {
        k: []
        for k in (
            "app_cpu",
            "app_wall",
            "dur_cpu",
            "dur_wall",
            "rdur_cpu",
            "rdur_wall",
            "raw_cpu",
            "raw_wall",
            "lean_cpu",
            "read_cpu",
            "read_wall",
            "rread_cpu",
            "rread_wall",
            "roff_cpu",
        )
    }
    # appends, alternating blocks
    for rep in range(reps + 1):
        keep = rep > 0  # the first block is a warm-up
        for _ in range(n_app):
            msg = user_message(cid)
            c0, w0 = pt(), pc()
            await store.append(cid, [msg])
            if keep:
                s["app_cpu"].append((pt() - c0) * 1e6)
                s["app_wall"].append((pc() - w0) * 1e6)
        for _ in range(n_app):
            c0, w0 = pt(), pc()
            raw_append(raw, rcid)
            if keep:
                s["raw_cpu"].append((pt() - c0) * 1e6)
                s["raw_wall"].append((pc() - w0) * 1e6)
        for _ in range(n_app):
            c0 = pt()
            raw_append(lean, lcid)
            if keep:
                s["lean_cpu"].append((pt() - c0) * 1e6)
        for _ in range(n_dur):  # fsynced commits (what agentik does for a user message)
            msg = user_message(cid)
            c0, w0 = pt(), pc()
            await store.append(cid, [msg], durable=True)
            if keep:
                s["dur_cpu"].append((pt() - c0) * 1e6)
                s["dur_wall"].append((pc() - w0) * 1e6)
        for _ in range(n_dur):
            c0, w0 = pt(), pc()
            raw_append(raw, rcid, durable=True)
            if keep:
                s["rdur_cpu"].append((pt() - c0) * 1e6)
                s["rdur_wall"].append((pc() - w0) * 1e6)
    # reads of the last 20 from a 1,000-message conversation
    cid2 = f"conv-{uuid.uuid4().hex}"
    await store.create_conversation(ConversationInfo(cid2, None, False, now, now))
    await store.append(cid2, [user_message(cid2) for _ in range(1000)])
    rcid2 = new_raw_conversation(raw)
    raw.execute("BEGIN")
    for _ in range(1000):
        raw.execute(
            INSERT,
            (f"msg-{uuid.uuid4().hex}", rcid2, "user", None, now.isoformat(), json.dumps(PAYLOAD)),
        )
    raw.execute("COMMIT")
    for rep in range(reps + 1):
        keep = rep > 0
        for _ in range(n_read):
            c0, w0 = pt(), pc()
            page = await store.list_messages(cid2, None, 980, 20)
            if keep:
                s["read_cpu"].append((pt() - c0) * 1e6)
                s["read_wall"].append((pc() - w0) * 1e6)
        assert len(page) == 20
        for _ in range(n_read):
            c0, w0 = pt(), pc()
            rows = raw_last20(raw, rcid2)
            if keep:
                s["rread_cpu"].append((pt() - c0) * 1e6)
                s["rread_wall"].append((pc() - w0) * 1e6)
        assert len(rows) == 20
        for _ in range(n_read):
            c0 = pt()
            raw_offset20(raw, rcid2, 980)
            if keep:
                s["roff_cpu"].append((pt() - c0) * 1e6)
    # a burst of simultaneous durable appends (500 sends at once): time until each is acked
    burst = 500
    s["burst_ms"], s["rburst_ms"] = [], []
    fsyncs = 0
    real_sync = store.db._sync_wal

    def counted_sync() -> None:
        nonlocal fsyncs
        fsyncs += 1
        real_sync()

    store.db._sync_wal = counted_sync  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    one_thread = ThreadPoolExecutor(max_workers=1)
    raw_wal = str(tmp / f"b9-raw-{pid}.db") + "-wal"

    def fsync_alone() -> None:  # the floor: what agentik did before, one fsync per commit
        fd = os.open(raw_wal, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    async def acked(coro: Any, t0: float) -> float:
        await coro
        return (pc() - t0) * 1e3

    async def raw_durable() -> None:
        raw_append(raw, rcid)
        await loop.run_in_executor(one_thread, fsync_alone)

    for _rep in range(reps):
        t0 = pc()
        s["burst_ms"] += await asyncio.gather(
            *(acked(store.append(cid, [user_message(cid)], durable=True), t0) for _ in range(burst))
        )
        t0 = pc()
        s["rburst_ms"] += await asyncio.gather(*(acked(raw_durable(), t0) for _ in range(burst)))
    one_thread.shutdown()
    await store.close()
    raw.close()
    lean.close()
    st = {k: stats(v) for k, v in s.items()}

    def met(a: str, f: str) -> bool:
        return st[a]["median"] / st[f]["median"] <= 2.0

    rows = [
        row(
            f"{burst} simultaneous durable appends, time to each ack (agentik: group commit; "
            "floor: each commit fsynced alone on one thread, as before)",
            st["burst_ms"],
            st["rburst_ms"],
            unit="ms",
            target="p50 ≤ 20 ms",
            met=st["burst_ms"]["median"] <= 20,
        ),
        row(
            "durable append (agentik: commit + WAL fsync on a thread, as send() does; raw: "
            "synchronous=FULL commit), CPU",
            st["dur_cpu"],
            st["rdur_cpu"],
            unit="µs",
            target="≤ 2x",
            met=met("dur_cpu", "rdur_cpu"),
        ),
        row(
            "durable append, wall",
            st["dur_wall"],
            st["rdur_wall"],
            unit="µs",
            target="≤ 2x",
            met=met("dur_wall", "rdur_wall"),
        ),
        row(
            "append (1 message, 1 commit, WAL + synchronous=NORMAL), CPU",
            st["app_cpu"],
            st["raw_cpu"],
            unit="µs",
            target="≤ 2x",
            met=met("app_cpu", "raw_cpu"),
        ),
        row(
            "append, wall (awaited until committed)",
            st["app_wall"],
            st["raw_wall"],
            unit="µs",
            target="≤ 2x",
            met=met("app_wall", "raw_wall"),
        ),
        row(
            "raw append: agentik schema vs without the 2 redundant FK indexes",
            st["raw_cpu"],
            st["lean_cpu"],
            unit="µs",
            target="(info)",
        ),
        row(
            "read last 20 of 1,000, CPU",
            st["read_cpu"],
            st["rread_cpu"],
            unit="µs",
            target="≤ 2x",
            met=met("read_cpu", "rread_cpu"),
        ),
        row(
            "read last 20 of 1,000, wall",
            st["read_wall"],
            st["rread_wall"],
            unit="µs",
            target="≤ 2x",
            met=met("read_wall", "rread_wall"),
        ),
        row(
            "raw read: OFFSET 980 page vs ORDER BY seq DESC LIMIT 20",
            st["roff_cpu"],
            st["rread_cpu"],
            unit="µs",
            target="(info)",
        ),
    ]
    drift = await common.schema_drift()
    notes = [
        "floor schema = agentik's: "
        + ("yes (same tables, indexes, trigger)" if not drift else "NO: " + "; ".join(drift)),
        f"{reps} alternating blocks x {n_app} appends / {n_read} reads each (after a warm-up "
        "block); per-op time.process_time (all threads) and perf_counter",
        "raw reads parse created_at and payload JSON like the store does",
        f"burst: {reps} bursts of {burst}; agentik used {fsyncs} fsyncs for "
        f"{reps * burst} acks (the floor {reps * burst})",
    ]
    return {
        "id": "B9",
        "title": "store: durable append, read of the last 20",
        "rows": rows,
        "notes": notes,
        "raw": st,
    }


if __name__ == "__main__":
    common.cli(main)
