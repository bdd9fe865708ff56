"""B27: a turn on PostgreSQL vs the same turn on SQLite, side by side in one run.

Two ``agentik serve`` processes on one fake LLM: one on a SQLite file (the default), one on a
throwaway PostgreSQL server (tests/postgres.py, started with PostgreSQL's defaults: a commit is
on disk, as SQLite's durable send is). Turns alternate between them in blocks, one at a time,
as B4 runs them (POST /agentik/conversations, GET …/events, POST …/messages, read to End).

Measured: the agentik server's CPU per turn (schedstat, all threads), the PostgreSQL server's
CPU per turn (its processes, summed: what the database machine spends), and the wall time of a
turn. Target (issue 26): agentik's CPU per turn on PostgreSQL ≤ 1.5× on SQLite.
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


async def main(args: Any) -> dict[str, Any]:
    from tests.postgres import start_server

    reps = common.repeats(args, 6, 2)
    n = 4 if args.quick else 15
    server = start_server(durable=True)
    if isinstance(server, str):
        return {"id": "B27", "title": "turn on PostgreSQL vs SQLite", "rows": [], "notes": [server]}
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
        server.stop()
    notes = [
        f"{reps} alternating blocks x {n} turns per shape and database, one turn at a time, "
        "after 5 warm-up turns each",
        "PostgreSQL: a throwaway local server (tests/postgres.py) with its default durability "
        "(fsync, synchronous_commit=on), over TCP on loopback; SQLite: WAL, the durable send "
        "fsynced",
    ]
    return {
        "id": "B27",
        "title": "turn on PostgreSQL vs SQLite",
        "rows": rows,
        "notes": notes,
        "raw": raw,
    }


if __name__ == "__main__":
    common.cli(main)
