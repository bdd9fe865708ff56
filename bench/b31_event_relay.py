"""B31: what sharing events between instances costs a streamed turn on PostgreSQL (issue 26).

Two agents in this process, each on a schema of its own on one throwaway PostgreSQL server
(tests/postgres.py), built as ``create_app`` builds them: "off", one instance per schema
(``PgDatabase(exclusive=True)``: events stay in the process, as on SQLite); "on", an instance
of many (``exclusive=False``): every event also goes to the event table (a batch at most every
20 ms, one INSERT + one NOTIFY), the agent-level events come back from it by the relay, and
event ids come from the database's sequence. Each turn: a reader on the conversation's events,
``send``, a 100-token streamed reply (ScriptedLLM), read to ``End``. Turns alternate between
them in blocks. Measured: this process's CPU per turn (all of agentik's work, the flusher's
and relay's included), the PostgreSQL server's CPU per turn (its processes), and wall time.
"""

from __future__ import annotations

import time
from typing import Any

import common
from b29_postgres import tree_cpu_ns
from common import row, stats

TOKENS = 100


async def open_agent(url: str, exclusive: bool) -> Any:
    from agentik.core import app
    from agentik.core.app import build_agent, load_settings
    from agentik.core.store.postgres import PgDatabase, PostgresStore
    from agentik.core.testing import ScriptedLLM, test_plugins

    pm = test_plugins()
    settings = load_settings(pm, {"AGENTIK_DATABASE_URL": url})
    real = app.make_store
    app.make_store = lambda s: PostgresStore(PgDatabase(url, exclusive=exclusive))  # type: ignore
    try:
        llm = ScriptedLLM()
        agent = build_agent(pm, settings, llm)
    finally:
        app.make_store = real
    await agent.open()
    return agent, llm


async def turns(agent: Any, llm: Any, conv: Any, n: int, cpu: list[float], wall: list[float]):
    from agentik.core.types import End, TextPart

    for _ in range(n):
        llm.steps.append([f"t{i} " for i in range(TOKENS)])
        c0, w0 = time.process_time(), time.perf_counter()
        after = conv.last_event_id
        sent = await conv.send([TextPart("hi")])
        async for item in conv.turn_events(sent.id, after):
            if isinstance(item.event, End):
                break
        await conv.wait_idle()
        cpu.append((time.process_time() - c0) * 1e6)
        wall.append((time.perf_counter() - w0) * 1e6)


async def main(args: Any) -> dict[str, Any]:
    from tests.postgres import start_server

    server = start_server()
    if isinstance(server, str):
        return {"rows": [], "notes": [f"skipped: {server}"]}
    reps, n = common.repeats(args, 7, 2), 20 if args.quick else 50
    agents = {
        "off": await open_agent(server.fresh_url(), True),
        "on": await open_agent(server.fresh_url(), False),
    }
    samples: dict[str, dict[str, list[float]]] = {
        k: {"cpu": [], "wall": [], "pg": []} for k in agents
    }
    try:
        convs = {k: await agent.create_conversation() for k, (agent, _) in agents.items()}
        for k, (agent, llm) in agents.items():  # warm up
            await turns(agent, llm, convs[k], 5, [], [])
        for _ in range(reps):
            for k, (agent, llm) in agents.items():
                pg0 = tree_cpu_ns(server.pid())
                cpu: list[float] = []
                await turns(agent, llm, convs[k], n, cpu, samples[k]["wall"])
                samples[k]["cpu"] += cpu
                samples[k]["pg"].append((tree_cpu_ns(server.pid()) - pg0) / 1e3 / n)
        shared = agents["on"][0].shared_events
        batches = shared.batches
    finally:
        for agent, _ in agents.values():
            await agent.close()
        server.stop()
    cpu = {k: stats(v["cpu"]) for k, v in samples.items()}
    out = {
        "turns_per_side": reps * n,
        "batches_on": batches,
        "rows": [
            row("agentik CPU µs/turn (on vs off)", cpu["on"], cpu["off"], unit="µs"),
            row(
                "PostgreSQL CPU µs/turn (on vs off)",
                stats(samples["on"]["pg"]),
                stats(samples["off"]["pg"]),
                unit="µs",
            ),
            row(
                "wall µs/turn (on vs off)",
                stats(samples["on"]["wall"]),
                stats(samples["off"]["wall"]),
                unit="µs",
            ),
        ],
    }
    return out


if __name__ == "__main__":
    common.cli(main)
