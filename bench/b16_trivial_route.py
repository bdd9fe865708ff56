"""B16: a trivial route, ``GET /health``, through agentik's app (its middleware and sub-app
routing) vs the bare aiohttp app of bench/floors/bare_app.py; keep-alive load from ``wrk``
(1 thread, 16 connections, 3 s) when it is installed, else from a Python keep-alive client.

Reported: requests/s (the load client shares the 2 CPUs, so this is a machine number) and the
server's CPU per request, which does not depend on the client (1e6 / µs = req/s per core).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
from typing import Any

import common
from common import CpuMeter, row, stats

SECONDS = 3


async def py_load(port: int, seconds: float, conns: int = 16) -> int:
    """Keep-alive GET /health on ``conns`` connections, one request in flight on each."""
    req = f"GET /health HTTP/1.1\r\nHost: {common.HOST}\r\n\r\n".encode()
    deadline = time.perf_counter() + seconds
    count = 0

    async def one() -> None:
        nonlocal count
        reader, writer = await asyncio.open_connection(common.HOST, port)
        try:
            while time.perf_counter() < deadline:
                writer.write(req)
                head = await reader.readuntil(b"\r\n\r\n")
                m = re.search(rb"(?i)content-length: *(\d+)", head)
                await reader.readexactly(int(m.group(1)) if m else 0)
                count += 1
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(conns)))
    return count


async def run_load(port: int, seconds: float) -> int:
    wrk = shutil.which("wrk")
    if wrk:
        out = await asyncio.to_thread(
            subprocess.run,
            [wrk, "-t1", "-c16", f"-d{seconds}s", f"http://{common.HOST}:{port}/health"],
            capture_output=True,
            text=True,
            check=True,
        )
        m = re.search(r"(\d+) requests in", out.stdout)
        assert m, out.stdout
        return int(m.group(1))
    return await py_load(port, seconds)


async def measure(proc: common.Proc, seconds: float) -> tuple[float, float]:
    with CpuMeter(proc.pid) as m:
        n = await run_load(proc.port, seconds)
    return n / m.wall, m.ns / n / 1e3


async def main(args: Any) -> dict[str, Any]:
    reps = common.repeats(args, 5, 2)
    seconds = 1 if args.quick else SECONDS
    fake = common.start_fake()
    agentik = common.start_agentik(fake.port)
    bare = common.start_floor("bare_app.py")
    rps: dict[str, list[float]] = {"agentik": [], "bare": []}
    cpu: dict[str, list[float]] = {"agentik": [], "bare": []}
    try:
        await measure(agentik, 1)
        await measure(bare, 1)
        for _ in range(reps):
            for name, p in (("agentik", agentik), ("bare", bare)):
                r, c = await measure(p, seconds)
                rps[name].append(r)
                cpu[name].append(c)
    finally:
        common.stop_all(agentik, bare, fake)
    ra, rb = stats(rps["agentik"]), stats(rps["bare"])
    ca, cb = stats(cpu["agentik"]), stats(cpu["bare"])
    client = "wrk -t1 -c16" if shutil.which("wrk") else "Python keep-alive client, 16 conns"
    rows = [
        row(
            "GET /health req/s (load client on the same 2 CPUs)",
            ra,
            rb,
            unit="req/s",
            target="≥ 0.8x",
            met=ra["median"] / rb["median"] >= 0.8,
        ),
        row(
            "server CPU per /health request",
            ca,
            cb,
            unit="µs",
            target="≤ 1.25x (= ≥ 0.8x req/s per core)",
            met=ca["median"] / cb["median"] <= 1.25,
            note=f"per core: agentik {1e6 / ca['median']:.0f} req/s, bare "
            f"{1e6 / cb['median']:.0f} req/s",
        ),
    ]
    notes = [f"{client}, {seconds} s per run, {reps} alternating repeats"]
    return {
        "id": "B16",
        "title": "trivial route through the app's middleware",
        "rows": rows,
        "notes": notes,
        "raw": {"rps": {"agentik": ra, "bare": rb}, "cpu": {"agentik": ca, "bare": cb}},
    }


if __name__ == "__main__":
    common.cli(main)
