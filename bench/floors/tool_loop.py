"""Floor for B13: a hand-written in-process tool loop, no framework.

A turn: record the user message (and touch the conversation) durably (synchronous=FULL, the
WAL fsynced inline: the cheapest correct way, as B3's "fair" floor), then ask the fake model;
while it answers with tool calls, for each call, in order: emit a ToolCall event, record the
``tool_call`` message and its working-memory row (the first one also carries the user's row)
in one transaction, decode the arguments with ``json.loads`` and call the tool, emit a
ToolResult event, record the ``tool_result`` message and its working-memory row in one
transaction; then hand the results back to the model. The final text is streamed into the
event buffer and recorded with its working-memory row in one transaction. That is exactly the
rows, payloads and transactions agentik writes for a tool turn (2 commits per hop); same
schema, pragmas; sqlite3 is called on the event loop.

The fake model is the same script as B13's ScriptedLLM and, like it, yields to the event loop
before each chunk (a network stream does): the user text ``"<calls per step> <steps>"`` asks
for that many ``count`` calls per step, each call's argument saying how many steps are left.

A tool is a plain function, or an ``async`` one (B13 calls ``get_current_time`` of
``mcp-server-time`` directly through the mcp ``Client`` that way).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
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
FINAL = "done"


def now() -> str:
    return datetime.now(UTC).isoformat()


def count(n: int) -> str:
    """The in-agent tool of B13: says how many steps are left."""
    return str(n)


def plan(text: str | None, results: list[str]) -> tuple[int, int]:
    """The script of B13's fake model (agentik's ScriptedLLM in B13 plays the same): the user
    text ``"<calls per step> <steps>"`` asks for that many calls per step; each call's argument
    is the number of steps left after it, which the ``count`` tool gives back. Returns ``(calls
    of this step, steps left after it)``; no calls: the final text. A result that is not a
    number (``get_current_time``'s JSON) ends the turn after that step."""
    if text is not None:
        per, steps = (int(x) for x in text.split())
    else:
        per = len(results)
        try:
            steps = int(results[-1])
        except ValueError:
            steps = 0
    return (per, steps - 1) if per and steps > 0 else (0, 0)


async def fake_model(
    text: str | None, results: list[str], tool: str, args: Callable[[int], str]
) -> AsyncIterator[Any]:
    """One step of the script: ``(call id, tool, args json)`` tuples, or the final text; then
    usage. ``text`` is the user's (first step), ``results`` the previous step's."""
    per, left = plan(text, results)
    if per == 0:
        await asyncio.sleep(0)
        yield FINAL
    for i in range(per):
        await asyncio.sleep(0)
        yield (f"call-{left}-{i}", tool, args(left))
    await asyncio.sleep(0)
    yield (10, 2)


class ToolLoop:
    def __init__(self, db_path: str, tools: dict[str, Callable[..., Any]]) -> None:
        self.db = connect(db_path)
        self.tools = tools
        self.events: deque[tuple[int, str, dict[str, Any]]] = deque(maxlen=1024)
        self.seq = 0

    def emit(self, kind: str, payload: dict[str, Any]) -> None:
        self.seq += 1
        self.events.append((self.seq, kind, payload))

    def tx(self, fn: Callable[[], None], durable: bool = False) -> None:
        begin(self.db, durable)
        fn()
        commit(self.db, durable)

    async def new_conversation(self) -> str:
        cid, ts = f"conv-{uuid.uuid4().hex}", now()
        self.tx(
            lambda: self.db.execute(
                "INSERT INTO conversation (id, title, created_at, updated_at) VALUES (?,?,?,?)",
                (cid, None, ts, ts),
            )
        )
        return cid

    def _record(
        self, cid: str, mid: str, kind: str, record: dict[str, Any], memory: list[tuple[str, str]]
    ) -> None:
        """One transaction: a message and the working-memory rows waiting to be written."""
        db, ts = self.db, now()
        rid = record.pop("_id")
        db.execute(
            INSERT_MESSAGE, (rid, cid, kind, mid, ts, json.dumps(record, ensure_ascii=False))
        )
        idx = db.execute(NEXT_IDX, (cid,)).fetchone()[0]
        for i, (role, payload) in enumerate(memory, start=idx):
            db.execute(INSERT_MEMORY, (cid, i, mid, role, payload, ts))
        memory.clear()

    async def turn(
        self, cid: str, text: str, tool: str = "count", args: Callable[[int], str] | None = None
    ) -> str:
        args = args or (lambda left: json.dumps({"n": left}))
        mid, ts = f"msg-{uuid.uuid4().hex}", now()
        db = self.db
        payload = json.dumps({"content": [{"type": "text", "body": text}]}, ensure_ascii=False)

        def user() -> None:
            db.execute(INSERT_MESSAGE, (mid, cid, "user", mid, ts, payload))
            db.execute("UPDATE conversation SET updated_at = ? WHERE id = ?", (ts, cid))

        self.tx(user, durable=True)
        memory = [("user", json.dumps({"text": text}, ensure_ascii=False))]
        out: list[str] = []
        first: str | None = text
        results: list[str] = []
        while True:
            calls: list[tuple[str, str, str]] = []
            step: list[str] = []
            started = False
            async for chunk in fake_model(first, results, tool, args):
                if isinstance(chunk, str):
                    if not started:
                        started = True
                        self.emit("StartResponse", {})
                    step.append(chunk)
                    out.append(chunk)
                    self.emit("AppendText", {"text": chunk})
                elif len(chunk) == 3:
                    calls.append(chunk)
            if not calls:
                break
            first, results = None, []
            for call_id, name, args_json in calls:
                record_id = f"tc-{uuid.uuid4().hex}"
                self.emit("ToolCall", {"callId": call_id, "toolName": name, "argsJson": args_json})
                memory.append(
                    (
                        "tool_call",
                        json.dumps(
                            {"call_id": call_id, "tool_name": name, "args_json": args_json},
                            ensure_ascii=False,
                        ),
                    )
                )
                call = {"_id": record_id, "callId": call_id, "toolName": name}
                call["argsJson"] = args_json
                self.tx(lambda c=call: self._record(cid, mid, "tool_call", c, memory))
                result = self.tools[name](**json.loads(args_json))
                if inspect.isawaitable(result):
                    result = await result
                result_id = f"tr-{uuid.uuid4().hex}"
                self.emit(
                    "ToolResult",
                    {"id": result_id, "callId": call_id, "text": result, "isError": False},
                )
                memory.append(
                    (
                        "tool_result",
                        json.dumps(
                            {"text": result, "call_id": call_id, "tool_name": name},
                            ensure_ascii=False,
                        ),
                    )
                )
                res = {"_id": result_id, "toolCallId": record_id, "callId": call_id}
                res |= {"toolName": name, "text": result, "isError": False}
                self.tx(lambda r=res: self._record(cid, mid, "tool_result", r, memory))
                results.append(result)
        reply = "".join(out)
        memory.append(("assistant", json.dumps({"text": "".join(step)}, ensure_ascii=False)))
        body = {"_id": f"as-{uuid.uuid4().hex}", "text": reply}
        body["tokens"] = {"input": 10, "output": 2}
        self.tx(lambda: self._record(cid, mid, "assistant", body, memory))
        self.emit("End", {})
        return reply

    def close(self) -> None:
        self.db.close()


async def demo() -> None:
    import tempfile
    import time

    with tempfile.TemporaryDirectory() as d:
        loop = ToolLoop(f"{d}/a.db", {"count": count})
        for script in ("0 1", "1 1", "100 1", "1 100"):
            cid = await loop.new_conversation()
            n = 200 if script.startswith(("0", "1 1")) else 10
            t = time.process_time()
            for _ in range(n):
                await loop.turn(cid, script)
            print(f"{script}: {(time.process_time() - t) / n * 1e6:.1f} µs CPU per turn")
        loop.close()


if __name__ == "__main__":
    asyncio.run(demo())
