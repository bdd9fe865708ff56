"""B1: cold start, exec -> ``GET /health`` 200, of ``agentik serve`` (openai backend, SQLite file
DB, the default plugins) vs the bare aiohttp app of bench/floors/bare_app.py started the same way
(AppRunner + TCPSite); and the wall time of ``agentik --help``.

/health is polled every 2 ms with a raw socket from the moment of exec. The fake LLM is running
(agentik does not call it at start-up). Every agentik start gets a new, empty database.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from typing import Any

import common
from common import row, stats


def cold_start(start: Any) -> float:
    p = start()
    try:
        t_up = common.wait_http(p, p.port, timeout=60)
        return (t_up - p.t_exec) * 1e3
    finally:
        p.stop()


async def main(args: Any) -> dict[str, Any]:
    return await asyncio.to_thread(measure, args)  # it all blocks: timing processes


def measure(args: Any) -> dict[str, Any]:
    reps = common.repeats(args, 7, 2)
    fake = common.start_fake()
    tmp = common.tmpdir()
    s: dict[str, list[float]] = {"agentik": [], "bare": [], "help": []}
    try:
        for i in range(reps + 1):  # alternate; the first round warms the page cache
            db = str(tmp / f"b1-{i}-{time.monotonic_ns()}.db")
            a = cold_start(lambda db=db: common.start_agentik(fake.port, db=db, wait=False))
            b = cold_start(lambda: common.start_floor("bare_app.py", wait=False))
            t0 = time.perf_counter()
            subprocess.run(
                [str(common.BIN / "agentik"), "--help"],
                check=True,
                capture_output=True,
                env=common.clean_env(),
            )
            h = (time.perf_counter() - t0) * 1e3
            if i:
                s["agentik"].append(a)
                s["bare"].append(b)
                s["help"].append(h)
        # where the start-up time goes (one run, -X importtime, top modules by cumulative time)
        out = subprocess.run(
            [
                common.PY,
                "-X",
                "importtime",
                "-c",
                "from agentik.core.app import create_app; from agentik.core.plugins import "
                "make_plugins; import agentik_llm_openai.backend, agentik_transport_http.routes",
            ],
            capture_output=True,
            text=True,
            env=common.clean_env(),
            check=True,
        )
        top = []
        for line in out.stderr.splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[1].strip().isdigit():
                top.append((int(parts[1]), parts[2].rstrip()))
        top = sorted(t for t in top if not t[1].startswith("  " * 2))[-8:][::-1]
        # is any SDK imported on the serving path? (the first run found `openai`, ~350 ms)
        sdk = subprocess.run(
            [
                common.PY,
                "-c",
                "import sys; from agentik.core.app import create_app; "
                "import agentik_llm_openai.backend, agentik_transport_http.routes; "
                "print(sorted(m for m in ('openai', 'httpx', 'httpx2', 'pydantic') "
                "if m in sys.modules))",
            ],
            capture_output=True,
            text=True,
            env=common.clean_env(),
            check=True,
        ).stdout.strip()
    finally:
        fake.stop()
    st = {k: stats(v) for k, v in s.items()}
    ratio = st["agentik"]["median"] / st["bare"]["median"]
    rows = [
        row(
            "exec -> /health 200",
            st["agentik"],
            st["bare"],
            unit="ms",
            target="≤ 1.5x bare",
            met=ratio <= 1.5,
        ),
        row(
            "`agentik --help` wall",
            st["help"],
            None,
            unit="ms",
            target="≤ 300 ms",
            met=st["help"]["median"] <= 300,
        ),
    ]
    notes = [
        f"{reps} alternating repeats after one warm-up round",
        "top imports by cumulative µs (-X importtime, one run): "
        + "; ".join(f"{name.strip()} {us / 1e3:.0f} ms" for us, name in top),
        f"of openai, httpx, httpx2, pydantic, the serving path's imports load: {sdk}",
    ]
    return {"id": "B1", "title": "cold start", "rows": rows, "notes": notes, "raw": st}


if __name__ == "__main__":
    common.cli(main)
