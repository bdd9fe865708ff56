"""Floor for B4/B6/B7 turns: agentik's conversation API flow written by hand, no framework.

Same HTTP flow and the same rows as agentik (so the client is identical for both):
``POST /agentik/conversations`` inserts the conversation (201); ``GET …/{id}/events`` is an SSE
StreamResponse fed by a per-subscriber queue; ``POST …/{id}/messages`` inserts the user message
(and touches the conversation) with sqlite3 in one transaction, durable before the 202 as
agentik's is (synchronous=FULL for that commit: SQLite fsyncs the WAL inline; agentik commits
and then fsyncs the WAL on a thread), then a task streams from the fake LLM with aiohttp +
``json.loads``, writes one SSE frame per delta and inserts the user's working-memory row, the
reply and the reply's working-memory row in a second transaction, as agentik's plain turn does.
Same schema and pragmas (WAL, synchronous=NORMAL). sqlite3 runs on the event loop. The chat's LLM
context is kept in memory and sent with every request, like agentik.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import uuid
from datetime import UTC, datetime

from aiohttp import web
from schema import begin, commit, connect
from upstream import make_session, stream_deltas

HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
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


class Floor:
    def __init__(self, db_path: str, upstream: str) -> None:
        self.db = connect(db_path)
        self.upstream = upstream
        self.subs: dict[str, list[asyncio.Queue[bytes]]] = {}
        self.history: dict[str, list[dict[str, str]]] = {}  # the LLM context of each chat
        self.seq = 0
        self.tasks: set[asyncio.Task[None]] = set()

    def publish(self, cid: str, kind: str, payload: dict[str, object]) -> None:
        self.seq += 1
        data = json.dumps(payload, separators=(",", ":"))
        frame = f"id: {self.seq}\nevent: {kind}\ndata: {data}\n\n".encode()
        for q in self.subs.get(cid, ()):
            q.put_nowait(frame)

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def create(self, request: web.Request) -> web.Response:
        cid, ts = f"conv-{uuid.uuid4().hex}", now()
        self.db.execute(
            "INSERT INTO conversation (id, title, created_at, updated_at) VALUES (?, ?, ?, ?)",
            (cid, None, ts, ts),
        )
        body = {"id": cid, "title": None, "temp": False, "createdAt": ts, "updatedAt": ts}
        return web.json_response(body, status=201)

    async def events(self, request: web.Request) -> web.StreamResponse:
        cid = request.match_info["id"]
        resp = web.StreamResponse(headers=HEADERS)
        await resp.prepare(request)
        q: asyncio.Queue[bytes] = asyncio.Queue()
        self.subs.setdefault(cid, []).append(q)
        try:
            while True:
                await resp.write(await q.get())
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            subs = self.subs.get(cid, [])
            if q in subs:
                subs.remove(q)
            if not subs:
                self.subs.pop(cid, None)
        return resp

    async def message(self, request: web.Request) -> web.Response:
        cid = request.match_info["id"]
        parts = await request.json()
        text = "".join(p["body"] for p in parts if p.get("type") == "text")
        mid, ts = f"msg-{uuid.uuid4().hex}", now()
        payload = {"content": parts}
        db = self.db
        begin(db, durable=True)  # the 202 promises the message: fsync this commit, like agentik
        db.execute(
            INSERT_MESSAGE, (mid, cid, "user", mid, ts, json.dumps(payload, ensure_ascii=False))
        )
        db.execute("UPDATE conversation SET updated_at = ? WHERE id = ?", (ts, cid))
        commit(db, durable=True)
        task = asyncio.create_task(self.turn(cid, mid, text))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        body = {"id": mid, "conversationId": cid, "type": "user", "createdAt": ts, **payload}
        return web.json_response(body, status=202)

    async def turn(self, cid: str, turn_id: str, text: str) -> None:
        out: list[str] = []
        history = self.history.setdefault(cid, [])
        async for delta in stream_deltas(self.session, self.upstream, text, history):
            if not out:
                self.publish(cid, "StartResponse", {"type": "StartResponse"})
            out.append(delta)
            self.publish(cid, "AppendText", {"type": "AppendText", "text": delta})
        reply = "".join(out)
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
        ts = now()
        payload = {"text": reply, "tokens": {"input": None, "output": None}}
        db = self.db
        db.execute("BEGIN")
        idx = db.execute(NEXT_IDX, (cid,)).fetchone()[0]
        db.execute(INSERT_MEMORY, (cid, idx, turn_id, "user", json.dumps({"text": text}), ts))
        db.execute(
            INSERT_MESSAGE,
            (
                f"as-{uuid.uuid4().hex}",
                cid,
                "assistant",
                turn_id,
                ts,
                json.dumps(payload, ensure_ascii=False),
            ),
        )
        db.execute(
            INSERT_MEMORY, (cid, idx + 1, turn_id, "assistant", json.dumps({"text": reply}), ts)
        )
        db.execute("COMMIT")
        self.publish(cid, "End", {"type": "End"})


async def main(host: str, port: int, upstream: str, db_path: str) -> None:
    floor = Floor(db_path, upstream)
    floor.session = make_session()  # type: ignore[attr-defined]
    app = web.Application()
    app.router.add_get("/health", floor.health)
    app.router.add_post("/agentik/conversations", floor.create)
    app.router.add_get("/agentik/conversations/{id}/events", floor.events)
    app.router.add_post("/agentik/conversations/{id}/messages", floor.message)
    runner = web.AppRunner(  # as `agentik serve` runs its app
        app, handle_signals=False, access_log=None, shutdown_timeout=1, handler_cancellation=True
    )
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    await floor.session.close()  # type: ignore[attr-defined]
    floor.db.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the fake's base URL, …/v1")
    parser.add_argument("--db", required=True)
    args = parser.parse_args()
    asyncio.run(main(args.host, args.port, args.upstream, args.db))
