"""B14: event-loop lag while streaming load keeps the server at ~70% of a core, and background
job dispatch latency (``JobRunner.spawn``), measured inside agentik's own process
(bench/lag_server.py: ``create_app`` + AppRunner, as ``agentik serve`` runs it, plus a 1 ms
sleeper and a job probe). Load: clients streaming turns at 50 tok/s (bench/load.py), their
number calibrated to ~70% server CPU. No floor: the targets are absolute.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import common
from common import row, stats
from load import calibrated_load, measure_util


async def main(args: Any) -> dict[str, Any]:
    windows = common.repeats(args, 5, 2)
    fake = common.start_fake()
    port = common.free_port()
    out = common.tmpdir() / f"lag-{port}.json"
    extra = ["--slow", str(args.slow)] if args.slow else []
    srv = common.Proc(
        [
            common.PY,
            str(common.BENCH / "lag_server.py"),
            "--port",
            str(port),
            "--out",
            str(out),
            *extra,
        ],
        common.agentik_env(fake.port, port),
        "lag_server",
    )
    srv.port = port
    rout = common.tmpdir() / f"lag-relay-{port}.json"
    relay = common.start_floor(
        "relay.py", "--upstream", f"http://{common.HOST}:{fake.port}/v1", "--lag-out", str(rout)
    )
    marks: dict[str, list[tuple[float, float]]] = {"idle": [], "load": [], "relay": []}
    rutils: list[float] = []
    utils: list[float] = []
    notes: list[str] = []
    try:
        common.wait_http(srv, port)
        async with common.session() as s:
            await asyncio.sleep(1.0)
            for _ in range(windows):
                t0 = time.monotonic()
                await asyncio.sleep(1.0)
                marks["idle"].append((t0, time.monotonic()))
            load, util = await calibrated_load(
                "agentik", port, srv.pid, s, 0.7, first=40, tokens=150
            )
            for _ in range(windows):
                t0 = time.monotonic()
                utils.append(await measure_util(srv.pid, 2.0))
                marks["load"].append((t0, time.monotonic()))
            await load.stop()
            # the same load on the minimal relay, as a reference for this machine
            rload, _ = await calibrated_load(
                "relay", relay.port, relay.pid, s, 0.7, first=100, tokens=150
            )
            for _ in range(windows):
                t0 = time.monotonic()
                rutils.append(await measure_util(relay.pid, 2.0))
                marks["relay"].append((t0, time.monotonic()))
            await rload.stop()
            notes.append(
                f"relay reference load: {rload.n} clients, relay CPU "
                f"{min(rutils) * 100:.0f}-{max(rutils) * 100:.0f}%"
            )
            notes.append(
                f"load: {load.n} clients at 50 tok/s, server CPU {util * 100:.0f}% at "
                f"calibration, {min(utils) * 100:.0f}-{max(utils) * 100:.0f}% in the "
                f"measured windows; {load.errors} load errors"
            )
    finally:
        srv.stop(timeout=20)
        relay.stop()
        fake.stop()
    if args.slow:
        slow_lines = [ln for ln in srv.output().splitlines() if "took" in ln]
        print("\n".join(slow_lines[-60:]))
    data = json.loads(out.read_text())

    rdata = json.loads(rout.read_text())

    def cut(kind: str, phase: str, d: dict[str, Any] = data) -> list[float]:
        return [v for t, v in d[kind] for a, b in marks[phase] if a <= t <= b]

    rows: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    for phase in ("idle", "load"):
        lag, jobs = stats(cut("lag", phase)), stats(cut("jobs", phase))
        raw[phase] = {"lag": lag, "jobs": jobs}
        label = "idle" if phase == "idle" else "~70% load"
        rows.append(
            row(
                f"loop lag p99 (1 ms sleeper overshoot), {label}",
                lag["p99"],
                None,
                unit="ms",
                target="≤ 5 ms",
                met=lag["p99"] <= 5,
                note=f"p50 {lag['median']:.2f} ms, n={lag['n']}",
            )
        )
        rows.append(
            row(
                f"loop lag max, {label}",
                lag["max"],
                None,
                unit="ms",
                target="≤ 50 ms",
                met=lag["max"] <= 50,
            )
        )
        rows.append(
            row(
                f"job dispatch latency (spawn -> running) p50 / p99, {label}",
                jobs,
                None,
                unit="ms",
                target="(info)",
                note=f"p99 {jobs['p99']:.2f} ms, max {jobs['max']:.2f} ms, n={jobs['n']}",
            )
        )
    rl = stats(cut("lag", "relay", rdata))
    raw["relay"] = rl
    rows.append(
        row(
            "reference: minimal relay's loop lag p99 / max at ~70% load",
            rl["p99"],
            None,
            unit="ms",
            target="(info)",
            note=f"max {rl['max']:.1f} ms",
        )
    )
    notes.append(f"{windows} idle windows of 1 s and {windows} loaded windows of 2 s")
    return {
        "id": "B14",
        "title": "event-loop lag under load; job dispatch",
        "rows": rows,
        "notes": notes,
        "raw": raw,
    }


def add_args(p: Any) -> None:
    p.add_argument("--slow", type=float, help="diagnosis: log server callbacks slower than this")


if __name__ == "__main__":
    common.cli(main, add_args)
