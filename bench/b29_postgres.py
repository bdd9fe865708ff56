"""B29: a turn on PostgreSQL vs the same turn on SQLite, side by side in one run.

Two ``agentik serve`` processes on one fake LLM: one on a SQLite file (the default), one on a
throwaway PostgreSQL server (tests/postgres.py, started with PostgreSQL's defaults: a commit is
on disk, as SQLite's durable send is). Turns alternate between them in blocks, one at a time,
as B4 runs them (POST /agentik/conversations, GET …/events, POST …/messages, read to End).

Measured: the agentik server's CPU per turn (schedstat, all threads), the PostgreSQL server's
CPU per turn (its processes, summed: what the database machine spends), and the wall time of a
turn. Target (issue 26): agentik's CPU per turn on PostgreSQL at most 1.5 times SQLite's.

Part 2, in process: a turn's store writes (the durable send, a tool step, the final reply,
each with its turn's move) three ways on one server: the store as shipped (the SQL store's
synchronous statements in pwasyncio's greenlet bridge, statements prepared once per
connection); the same through pwasyncio's own execution (``execute_sql``, which prepares every
statement anew); and plain asyncpg, the same statements written as coroutines (the floor: no
bridge, no store).
"""

from __future__ import annotations

import os
from typing import Any

import common
from common import CpuMeter, TurnClient, cpu_ns, row, spec_text, stats

SHAPES = (("1-token reply, new conversation", 1, False), ("100-token reply, existing", 100, True))


def tree_cpu_ns(pid: int) -> int:
    """CPU time of a process and of its children (the PostgreSQL server's backends)."""
    total = cpu_ns(pid)
    for child in os.popen(f"ps -o pid= --ppid {pid}").read().split():
        total += cpu_ns(int(child))
    return total


_server: Any = None


async def store_turn(store: Any, cid: str, i: int) -> None:
    """One turn's writes, as the turn engine makes them."""
    from agentik.core.llm import HistoryItem
    from agentik.core.records import utcnow
    from agentik.core.turns import TurnState, TurnUpdate
    from agentik.core.types import Message

    uid = f"u{i}"
    body = {"content": [{"type": "text", "body": "hello"}]}
    await store.add_user_message(Message(uid, cid, "user", utcnow(), body))
    call = HistoryItem("tool_call", call_id="c", tool_name="f", args_json="{}")
    await store.append(
        cid,
        [Message(f"t{i}", cid, "tool_call", utcnow(), {"callId": "c", "name": "f"})],
        [HistoryItem("user", "hello"), call],
        turn_id=uid,
        turn=TurnUpdate(TurnState.RUNNING, 1),
    )
    await store.append(
        cid,
        [Message(f"a{i}", cid, "assistant", utcnow(), {"text": "done", "tokens": {"input": 1}})],
        [HistoryItem("tool_result", "ok", call_id="c"), HistoryItem("assistant", "done")],
        turn_id=uid,
        touch=utcnow(),
        turn=TurnUpdate(TurnState.DONE, 2),
    )


async def plain_turn(conn: Any, cid: str, i: int) -> None:
    """The same writes on a bare asyncpg connection (the floor)."""
    import json

    from agentik.core.records import utcnow

    uid, now = f"u{i}", utcnow().isoformat()
    msg = "INSERT INTO message (id, conversation_id, kind, turn_id, created_at, payload_json) "
    msg += "VALUES ($1, $2, $3, $4, $5, $6)"
    mem = "INSERT INTO working_memory (conversation_id, order_idx, turn_id, role, payload_json, "
    mem += "created_at) VALUES ($1, $2, $3, $4, $5, $6)"
    move = "UPDATE turn SET state = $1, step = $2, waits_json = NULL, updated_at = $3 "
    move += "WHERE id = $4 AND state = ANY($5::text[])"
    last = "SELECT coalesce(max(order_idx), -1) FROM working_memory WHERE conversation_id = $1"
    body = json.dumps({"content": [{"type": "text", "body": "hello"}]})
    async with conn.transaction():
        await conn.execute("SET LOCAL synchronous_commit TO on")
        await conn.execute(msg, uid, cid, "user", uid, now, body)
        await conn.execute(
            "INSERT INTO turn (id, conversation_id, state, step, idempotency_key, created_at, "
            "updated_at) VALUES ($1, $2, 'queued', 0, NULL, $3, $3)",
            uid,
            cid,
            now,
        )
        await conn.execute("UPDATE conversation SET updated_at = $1 WHERE id = $2", now, cid)
    for step, state, kind, items in (
        (1, "running", "tool_call", ('{"text": "hello"}', '{"call_id": "c"}')),
        (2, "done", "assistant", ('{"text": "ok"}', '{"text": "done"}')),
    ):
        async with conn.transaction():
            await conn.execute(move, state, step, now, uid, ["queued", "running", "waiting"])
            await conn.execute(msg, f"{kind}{i}", cid, kind, uid, now, '{"text": "done"}')
            at = await conn.fetchval(last, cid)
            for n, item in enumerate(items, start=at + 1):
                await conn.execute(mem, cid, n, uid, "user", item, now)


async def in_process(url: str, reps: int, n: int) -> list[dict[str, Any]]:
    import time

    import asyncpg
    from playhouse.pwasyncio import AsyncPostgresqlConnection, await_

    from agentik.core.store.postgres import PgDatabase, PostgresStore
    from tests.store_contract import conv

    class PeeweeExecution(PgDatabase):
        """Every statement through pwasyncio's execute_sql, on its own connection wrapper."""

        def execute(self, sql: str, params: Any = ()) -> Any:
            if not params:  # DDL at start-up (several statements: not preparable)
                return super().execute(sql, params)
            return self.db.execute_sql(sql.replace("?", "%s"), params)

        async def _run(self, fn: Any, begin: Any = None) -> Any:
            import agentik.core.store.postgres as pgmod

            real = pgmod._Connection
            pgmod._Connection = lambda conn, shapes: AsyncPostgresqlConnection(conn)  # type: ignore
            try:
                return await super()._run(fn, begin)
            finally:
                pgmod._Connection = real

    assert await_ is not None
    shipped = PostgresStore(PgDatabase(url, exclusive=False))
    peewee_way = PostgresStore(PeeweeExecution(url, exclusive=False))
    for s in (shipped, peewee_way):
        await s.open()
    conn = await asyncpg.connect(url, server_settings={"synchronous_commit": "off"})
    cpu: dict[str, list[float]] = {"shipped": [], "pwasyncio": [], "asyncpg": []}
    try:
        ways: dict[str, Any] = {
            "shipped": lambda cid, i: store_turn(shipped, cid, i),
            "pwasyncio": lambda cid, i: store_turn(peewee_way, cid, i),
            "asyncpg": lambda cid, i: plain_turn(conn, cid, i),
        }
        counter = 0
        for r in range(reps + 1):  # the first round warms up
            for name, way in ways.items():
                cid = f"{name}-{r}"
                await shipped.create_conversation(conv(cid))
                for _ in range(n):
                    counter += 1
                    t0 = time.process_time()
                    await way(cid, counter)
                    if r:
                        cpu[name].append((time.process_time() - t0) * 1e6)
    finally:
        await conn.close()
        for s in (shipped, peewee_way):
            await s.close()
    a, p, f = stats(cpu["shipped"]), stats(cpu["pwasyncio"]), stats(cpu["asyncpg"])
    return [
        row(
            "in process, a turn's store writes: shipped vs plain asyncpg",
            a,
            f,
            unit="µs",
            target="(info)",
        ),
        row(
            "in process, a turn's store writes: pwasyncio's execution vs plain asyncpg",
            p,
            f,
            unit="µs",
            target="(info)",
        ),
    ]


async def main(args: Any) -> dict[str, Any]:
    from tests.postgres import start_server

    reps = common.repeats(args, 6, 2)
    n = 4 if args.quick else 15
    server = start_server(durable=True)
    global _server
    _server = server
    if isinstance(server, str):
        return {"id": "B29", "title": "turn on PostgreSQL vs SQLite", "rows": [], "notes": [server]}
    fake = common.start_fake()
    sqlite = common.start_agentik(fake.port)
    pg = common.start_agentik(fake.port, AGENTIK_DATABASE_URL=server.fresh_url())
    raw: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    try:
        async with common.session() as s:
            clients = {"sqlite": TurnClient(sqlite.port, s), "postgres": TurnClient(pg.port, s)}
            pids = {"sqlite": sqlite.pid, "postgres": pg.pid}
            for c in clients.values():  # warm-up
                for _ in range(5):
                    await c.turn(spec_text(1))
            for label, tokens, existing in SHAPES:
                cpu: dict[str, list[float]] = {"sqlite": [], "postgres": []}
                wall: dict[str, list[float]] = {"sqlite": [], "postgres": []}
                db_cpu: list[float] = []
                cids = {k: await c.new_conversation() for k, c in clients.items()}
                for _ in range(reps):
                    for name, c in clients.items():
                        for _ in range(n):
                            pg0 = tree_cpu_ns(server.pid())
                            with CpuMeter(pids[name]) as m:
                                r = await c.turn(
                                    spec_text(tokens), cid=cids[name] if existing else None
                                )
                            assert r["tokens"] == tokens, r
                            cpu[name].append(m.ns / 1e3)
                            wall[name].append(r["wall_ms"])
                            if name == "postgres":
                                db_cpu.append((tree_cpu_ns(server.pid()) - pg0) / 1e3)
                p, q = stats(cpu["postgres"]), stats(cpu["sqlite"])
                raw[label] = {"cpu": cpu, "wall": wall, "db_cpu": db_cpu}
                rows.append(
                    row(
                        f"agentik server CPU per turn, {label} (PostgreSQL vs SQLite)",
                        p,
                        q,
                        unit="µs",
                        target="≤ 1.5x",
                        met=p["median"] / q["median"] <= 1.5,
                    )
                )
                rows.append(
                    row(
                        f"PostgreSQL server CPU per turn, {label}",
                        stats(db_cpu),
                        unit="µs",
                        target="(info)",
                    )
                )
                rows.append(
                    row(
                        f"turn wall time, {label} (PostgreSQL vs SQLite)",
                        stats(wall["postgres"]),
                        stats(wall["sqlite"]),
                        unit="ms",
                        target="(info)",
                    )
                )
    finally:
        pg.stop()
        sqlite.stop()
        fake.stop()
    try:
        rows += await in_process(server.fresh_url(), reps, 20 if args.quick else 100)
    finally:
        server.stop()
    notes = [
        f"{reps} alternating blocks x {n} turns per shape and database, one turn at a time, "
        "after 5 warm-up turns each",
        "PostgreSQL: a throwaway local server (tests/postgres.py) with its default durability "
        "(fsync, synchronous_commit=on), over TCP on loopback; SQLite: WAL, the durable send "
        "fsynced",
    ]
    return {
        "id": "B29",
        "title": "turn on PostgreSQL vs SQLite",
        "rows": rows,
        "notes": notes,
        "raw": raw,
    }


if __name__ == "__main__":
    common.cli(main)
