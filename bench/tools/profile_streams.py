"""Where the memory of an idle SSE stream goes: ``agentik serve`` under ``tracemalloc``, snapshots
before N idle streams open, while they are open and after they closed; the allocations they
added, grouped by line (``--group traceback`` for whole stacks), per stream.

    python bench/tools/profile_streams.py                      # 2,000 agent-level streams
    python bench/tools/profile_streams.py --path conversation  # one conversation each (N/2)

tracemalloc sees Python's allocations (objects, buffers), not what the C parser or the kernel
hold: it says where, B8's RSS says how much.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the suite's helpers

import common
from b08_streams import open_many
from common import TurnClient

SERVER = """
import os, signal, sys, tracemalloc
tracemalloc.start(int(os.environ["FRAMES"]))
count = [0]
def dump(*_):
    count[0] += 1
    tracemalloc.take_snapshot().dump(os.environ["SNAPSHOTS"] + f"/{count[0]}.snap")
signal.signal(signal.SIGUSR1, dump)
from agentik.core.cli import main
sys.exit(main(["serve"]))
"""


async def snapshot(p: common.Proc, folder: Path, n: int) -> tracemalloc.Snapshot:
    p.proc.send_signal(signal.SIGUSR1)
    path = folder / f"{n}.snap"
    deadline = time.monotonic() + 60
    while True:  # written once complete: wait until its size stops changing
        if path.exists():
            size = path.stat().st_size
            await asyncio.sleep(0.5)
            if size and path.stat().st_size == size:
                return tracemalloc.Snapshot.load(str(path))
        elif time.monotonic() > deadline:
            raise RuntimeError(f"no snapshot:\n{p.output()[-2000:]}")
        await asyncio.sleep(0.2)


def top(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, n: int, group: str) -> str:
    stats = after.compare_to(before, group)
    total = sum(s.size_diff for s in stats)
    lines = [f"total {total / n:,.0f} B per stream ({total / 2**20:.1f} MiB for {n})"]
    for s in stats[:25]:
        where = (
            s.traceback.format()[-1].strip()
            if group == "lineno"
            else "\n    ".join(s.traceback.format())
        )
        lines.append(f"{s.size_diff / n:9,.0f} B {s.count_diff / n:6.2f} blocks  {where}")
    return "\n".join(lines)


async def main(args: Any) -> dict[str, Any]:
    fake = common.start_fake()
    folder = common.tmpdir() / f"snaps-{time.monotonic_ns()}"
    folder.mkdir()
    port = common.free_port()
    env = common.agentik_env(
        fake.port,
        port,
        SNAPSHOTS=str(folder),
        FRAMES=str(args.frames),
        AGENTIK_MAX_CONNECTIONS=str(args.streams + 100),
    )
    p = common.Proc([common.PY, "-c", SERVER], env, "traced")
    report: dict[str, Any] = {}
    try:
        common.wait_http(p, port, timeout=60)
        async with common.session() as s:
            c = TurnClient(port, s)
            n = args.streams
            if args.path == "conversation":
                n //= 2
                cids = [await c.new_conversation() for _ in range(n)]
                paths = [f"/agentik/conversations/{cid}/events" for cid in cids]
            else:
                paths = ["/agentik/events"] * n
            await open_many(port, paths[:10])  # warm-up: imports, first-use caches
            await asyncio.sleep(0.5)
            base = await snapshot(p, folder, 1)
            rss_base = common.rss_kib(p.pid)
            streams = await open_many(port, paths)
            await asyncio.sleep(1)
            held = await snapshot(p, folder, 2)
            rss_held = common.rss_kib(p.pid)
            for st in streams:
                st.close()
            await asyncio.sleep(2)
            gone = await snapshot(p, folder, 3)
            rss_gone = common.rss_kib(p.pid)
        report = {
            "streams": n,
            "rss_kib": {"before": rss_base, "open": rss_held, "closed": rss_gone},
            "rss_per_stream_kib": (rss_held - rss_base) / n,
        }
        print(f"RSS {rss_base} -> {rss_held} -> {rss_gone} KiB")
        print(f"open, by {args.group}:\n{top(base, held, n, args.group)}\n")
        print(f"left after they closed:\n{top(base, gone, n, args.group)}")
    finally:
        p.stop(timeout=30)
        fake.stop()
    return report


def add_args(p: Any) -> None:
    p.add_argument("--streams", type=int, default=2000)
    p.add_argument("--path", choices=("agent", "conversation"), default="agent")
    p.add_argument("--group", choices=("lineno", "traceback", "filename"), default="lineno")
    p.add_argument("--frames", type=int, default=1, help="frames kept per allocation")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    common.cli(main, add_args)
