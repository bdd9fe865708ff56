"""B30: many instances on one PostgreSQL behind HAProxy vs one instance, side by side in one run.

A throwaway PostgreSQL server (tests/postgres.py, PostgreSQL's default durability) and the fake
LLM; three topologies, each on a schema of its own, each behind HAProxy with the documented
configuration (docs/haproxy.cfg through tests/cluster.py, so the proxy's hop is in every one):
one instance; three instances with the consistent hash on the conversation id; three
instances round-robin (a conversation's SSE and its send may land on different instances: the
send is handed to the owner through the database, the events relayed through it).

Measured:
- agentik's CPU per turn: the CPU of every agentik process of the topology (schedstat, all
  threads) over a block of turns run one at a time, divided by the turns. Targets (issue 26):
  3 instances hash ≤ 1.2x one instance; round-robin ≤ 1.5x hash.
- 500 simultaneous sends (one per conversation, 500 connections) through HAProxy: time from
  the start of the burst to each 202, three instances (hash) vs one. Target: p50 ≤ 1/2 of one
  instance's, 0 errors.

Two cores cannot show a throughput curve: three instances and the database share them, so
the burst measures how the work spreads, not how it scales; PERFORMANCE.md gives the CPU-per-
turn model that predicts more cores.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import common
from common import TurnClient, cpu_ns, row, spec_text, stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: turns a conversation in the steady-state row
PER_CONV = 5
TOPOLOGIES = (("one", 1, "hash"), ("hash3", 3, "hash"), ("rr3", 3, "roundrobin"))


def settings(fake_port: int) -> dict[str, str]:
    return {
        "OPENAI_BASE_URL": f"http://{common.HOST}:{fake_port}/v1",
        "OPENAI_API_KEY": "sk-bench",
        "OPENAI_MODEL": "fake-model",
        "OPENAI_MAX_RETRIES": "0",
        "AGENTIK_LOG_LEVEL": "warning",
        "AGENTIK_REFLECTION_INTERVAL": "0",
        "AGENTIK_LEASE_TTL": "10",
    }


def cluster_cpu_ns(cluster: Any) -> int:
    return sum(cpu_ns(i.proc.proc.pid) for i in cluster.instances if i.alive)


async def timed_turn(
    client: TurnClient, name: str, failed: dict[str, int], cid: str | None = None
) -> dict[str, float] | None:
    """One turn; a turn whose End did not come in 20 s is counted, not fatal."""
    try:
        return await client.turn(spec_text(20), cid=cid, timeout=20)
    except (TimeoutError, ConnectionError, RuntimeError) as e:
        failed[name] += 1
        print(f"B30 {name}: a turn failed: {type(e).__name__} {e}", file=sys.stderr)
        return None


async def burst(port: int, n: int, kinds: Counter[str]) -> tuple[list[float], int]:
    """``n`` conversations, then one send to each at once: ms to each 202, and the errors
    (each counted in ``kinds`` by what it was)."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        client = TurnClient(port, session)
        cids = [await client.new_conversation() for _ in range(n)]
        t0 = time.perf_counter()
        errors = 0

        async def send(cid: str) -> float | None:
            nonlocal errors
            try:
                await client.post(cid, "hello")
            except (AssertionError, aiohttp.ClientError, OSError) as e:
                errors += 1
                kinds[repr(e)[:200]] += 1
                return None
            return (time.perf_counter() - t0) * 1e3

        done = await asyncio.gather(*(send(cid) for cid in cids))
    return [d for d in done if d is not None], errors


async def main(args: Any) -> dict[str, Any]:
    from tests.cluster import Cluster, haproxy_bin
    from tests.postgres import start_server

    common.raise_fd_limit()
    # a timeout's SIGTERM unwinds through the finally below: the instances, HAProxy and the
    # PostgreSQL server are stopped (they run in sessions of their own)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    reps = common.repeats(args, 5, 2)
    n_turns = 5 if args.quick else 20
    n_burst = 200 if args.quick else 500
    if haproxy_bin() is None:
        return {"id": "B30", "title": "many instances", "rows": [], "notes": ["no haproxy"]}
    server = start_server(durable=True)
    if isinstance(server, str):
        return {"id": "B30", "title": "many instances", "rows": [], "notes": [server]}
    fake = common.start_fake()
    clusters: dict[str, Any] = {}
    cpu: dict[str, list[float]] = {name: [] for name, _, _ in TOPOLOGIES}
    wall: dict[str, list[float]] = {name: [] for name, _, _ in TOPOLOGIES}
    ack: dict[str, list[float]] = {"one": [], "hash3": []}
    steady: dict[str, list[float]] = {"one": [], "hash3": []}  # PER_CONV turns a conversation
    errors = {"one": 0, "hash3": 0}
    kinds: Counter[str] = Counter()  # what the errors were
    failed: dict[str, int] = {name: 0 for name, _, _ in TOPOLOGIES}  # turns without an End
    try:
        for name, n, mode in TOPOLOGIES:
            root = common.tmpdir() / f"b30-{name}"
            root.mkdir(parents=True, exist_ok=True)
            cluster = Cluster(root, server.fresh_url(), settings(fake.port))
            clusters[name] = cluster.start(n, mode)
        async with common.session() as s:
            clients = {k: TurnClient(c.proxy_port, s) for k, c in clusters.items()}
            for name, c in clients.items():  # warm-up: every instance has served turns
                for _ in range(6):
                    await timed_turn(c, name, failed)
            for _ in range(reps):
                for name, client in clients.items():
                    cids = [await client.new_conversation() for _ in range(n_turns)]
                    c0 = cluster_cpu_ns(clusters[name])
                    for cid in cids:  # one at a time: CPU per turn, not contention
                        r = await timed_turn(client, name, failed, cid)
                        if r is not None:
                            wall[name].append(r["wall_ms"])
                    await asyncio.sleep(0.3)  # the turns' last writes (ends, event flush)
                    cpu[name].append((cluster_cpu_ns(clusters[name]) - c0) / 1e3 / n_turns)
                for name in ("one", "hash3"):  # conversations of several turns
                    client = clients[name]
                    made = [await client.new_conversation() for _ in range(n_turns // PER_CONV)]
                    c0 = cluster_cpu_ns(clusters[name])
                    for cid in made:
                        for _ in range(PER_CONV):
                            await timed_turn(client, name, failed, cid)
                    await asyncio.sleep(0.3)
                    steady[name].append((cluster_cpu_ns(clusters[name]) - c0) / 1e3 / n_turns)
        for _ in range(reps):
            for name in ("one", "hash3"):
                times, refused = await burst(clusters[name].proxy_port, n_burst, kinds)
                ack[name] += times
                errors[name] += refused
                await asyncio.sleep(2)  # the turns the burst started finish
    finally:
        for cluster in clusters.values():
            cluster.close()
        fake.stop()
        server.stop()
    one, hash3, rr3 = stats(cpu["one"]), stats(cpu["hash3"]), stats(cpu["rr3"])
    a1, a3 = stats(ack["one"]), stats(ack["hash3"])
    rows = [
        row(
            "agentik CPU per turn (all instances), 3 instances hash vs 1 instance",
            hash3,
            one,
            unit="µs",
            target="≤ 1.2x",
            met=hash3["median"] / one["median"] <= 1.2,
        ),
        row(
            f"agentik CPU per turn (all instances), {PER_CONV} turns a conversation: 3 "
            "instances hash vs 1 instance",
            stats(steady["hash3"]),
            stats(steady["one"]),
            unit="µs",
            target="≤ 1.2x",
            met=stats(steady["hash3"])["median"] / stats(steady["one"])["median"] <= 1.2,
        ),
        row(
            "agentik CPU per turn (all instances), 3 instances round-robin vs hash",
            rr3,
            hash3,
            unit="µs",
            target="≤ 1.5x",
            met=rr3["median"] / hash3["median"] <= 1.5,
        ),
        row(
            "turn wall time through HAProxy, 3 instances hash vs 1",
            stats(wall["hash3"]),
            stats(wall["one"]),
            unit="ms",
            target="(info)",
        ),
        row(
            "turn wall time through HAProxy, 3 instances round-robin vs hash",
            stats(wall["rr3"]),
            stats(wall["hash3"]),
            unit="ms",
            target="(info)",
        ),
        row(
            f"{n_burst} simultaneous sends through HAProxy, time to each 202: 3 instances vs 1",
            a3,
            a1,
            unit="ms",
            target="p50 ≤ 0.5x, 0 errors",
            met=a3["median"] <= 0.5 * a1["median"] and not any(errors.values()),
        ),
    ]
    notes = [
        f"{reps} alternating blocks of {n_turns} turns (a 20-token streamed reply, new "
        "conversation each, one turn at a time) per topology, after 6 warm-up turns each; CPU: "
        "the sum over the topology's agentik processes (not HAProxy's, not PostgreSQL's)",
        f"then as many turns in conversations of {PER_CONV} (one vs hash): with the hash, a "
        "conversation's first turn runs on an instance that loads it from the database (the "
        "create, which has no id to hash, went to another); its next turns find it in memory",
        f"{reps} bursts of {n_burst} each, alternating; errors: {errors} {dict(kinds)}",
        f"turns without an End within 20 s, per topology: {failed}",
        f"machine: {os.cpu_count()} cores shared by the instances, PostgreSQL, HAProxy, the "
        "fake LLM and the client",
    ]
    raw = {"cpu": cpu, "steady": steady, "errors": errors, "failed": failed}
    return {"id": "B30", "title": "many instances behind HAProxy vs one", "rows": rows,
            "notes": notes, "raw": raw}  # fmt: skip


if __name__ == "__main__":
    common.cli(main)
