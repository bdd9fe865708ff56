"""Floor for B3/B10: a hand-written in-process chat turn, no framework.

A turn: record the user message (and touch the conversation) durably, stream the fake model's
reply into an event buffer, then record the user's working-memory row, the assistant message and
its working-memory row in one transaction. That is exactly the rows and transactions agentik
writes for a plain turn (2 commits, the first one fsynced); same schema, pragmas. sqlite3 is
called on the event loop. Variants:

* ``fair``         the durable commit is synchronous=FULL (SQLite fsyncs the WAL inline): the
                   cheapest correct hand-written loop, THE floor of B3 and B10
* ``fsync_thread`` the durable commit is a synchronous=NORMAL commit, then an fsync of the WAL
                   file on a one-thread pool, awaited (what ``agentik/core/db.py`` does)
* ``nopersist``    no database at all: model stream -> events -> joined reply
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from schema import begin, commit, connect

INSERT_MESSAGE = (
    "INSERT INTO message (id, conversation_id, kind, turn_id, created_at, payload_json) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
INSERT_MEMORY = (
    "INSERT INTO working_memory (conversation_id, order_idx, turn_id, role, payload_json, "
    "created_at) VALUES (?, ?, ?, ?, ?, ?)"
)
NEXT_IDX = "SELECT coalesce(max(order_idx), -1) + 1 FROM working_memory WHERE conversation_id = ?"


def now() -> str:
    return datetime.now(UTC).isoformat()


async def fake_model(text: str) -> AsyncIterator[Any]:
    """The same reply as agentik's ScriptedLLM default: one text delta, then usage."""
    yield "echo: " + text
    yield (len(text), 2)


class Loop:
    def __init__(self, db_path: str | None, fsync_thread: bool = False) -> None:
        self.path = db_path
        self.db = connect(db_path) if db_path else None
        self.pool = ThreadPoolExecutor(1) if fsync_thread else None
        self.events: deque[tuple[int, str, dict[str, Any]]] = deque(maxlen=1024)
        self.seq = 0

    def emit(self, kind: str, payload: dict[str, Any]) -> None:
        self.seq += 1
        self.events.append((self.seq, kind, payload))

    async def tx(self, fn: Callable[[], None], durable: bool = False) -> None:
        assert self.db is not None
        if self.pool is None:
            begin(self.db, durable)
            fn()
            commit(self.db, durable)
            return
        begin(self.db)
        fn()
        commit(self.db)
        if durable:
            await asyncio.get_running_loop().run_in_executor(self.pool, self._sync_wal)

    def _sync_wal(self) -> None:
        fd = os.open(f"{self.path}-wal", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    async def new_conversation(self) -> str:
        cid, ts = f"conv-{uuid.uuid4().hex}", now()
        if self.db is not None:
            db = self.db
            await self.tx(
                lambda: db.execute(
                    "INSERT INTO conversation (id, title, created_at, updated_at) VALUES (?,?,?,?)",
                    (cid, None, ts, ts),
                )
            )
        return cid

    async def turn(self, cid: str, text: str) -> str:
        mid, ts = f"msg-{uuid.uuid4().hex}", now()
        db = self.db
        if db is not None:
            payload = json.dumps({"content": [{"type": "text", "body": text}]}, ensure_ascii=False)

            def user() -> None:
                db.execute(INSERT_MESSAGE, (mid, cid, "user", mid, ts, payload))
                db.execute("UPDATE conversation SET updated_at = ? WHERE id = ?", (ts, cid))

            await self.tx(user, durable=True)
        out: list[str] = []
        usage: Any = None
        started = False
        async for chunk in fake_model(text):
            if isinstance(chunk, str):
                if not started:
                    started = True
                    self.emit("StartResponse", {})
                out.append(chunk)
                self.emit("AppendText", {"text": chunk})
            else:
                usage = chunk
        reply = "".join(out)
        if db is not None:
            body = json.dumps(
                {"text": reply, "tokens": {"input": usage[0], "output": usage[1]}},
                ensure_ascii=False,
            )

            def assistant() -> None:
                ts2 = now()
                aid = f"as-{uuid.uuid4().hex}"
                db.execute(INSERT_MESSAGE, (aid, cid, "assistant", mid, ts2, body))
                idx = db.execute(NEXT_IDX, (cid,)).fetchone()[0]
                db.execute(INSERT_MEMORY, (cid, idx, mid, "user", json.dumps({"text": text}), ts2))
                db.execute(
                    INSERT_MEMORY,
                    (cid, idx + 1, mid, "assistant", json.dumps({"text": reply}), ts2),
                )

            await self.tx(assistant)
        self.emit("End", {})
        return reply

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
        if self.db is not None:
            self.db.close()


async def demo() -> None:
    import tempfile
    import time

    with tempfile.TemporaryDirectory() as d:
        for name, loop in (
            ("fair", Loop(f"{d}/a.db")),
            ("fsync_thread", Loop(f"{d}/b.db", fsync_thread=True)),
            ("nopersist", Loop(None)),
        ):
            cid = await loop.new_conversation()
            t = time.process_time()
            for _ in range(2000):
                await loop.turn(cid, "hi")
            print(f"{name}: {(time.process_time() - t) / 2000 * 1e6:.1f} µs CPU per turn")
            loop.close()


if __name__ == "__main__":
    asyncio.run(demo())
