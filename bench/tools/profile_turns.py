"""Where agentik's server time goes: ``agentik serve`` under cProfile (the event-loop thread,
which also runs SQLite; not the thread that fsyncs acknowledged messages) while the bench client
runs turns against it.

    python bench/profile_turns.py --tokens 1 --turns 300          # the fixed cost of a turn
    python bench/profile_turns.py --tokens 1000 --turns 20        # the per-token path
    python bench/profile_turns.py --tokens 1 --health 5000        # the /health route
    python bench/profile_turns.py --streams 80 --seconds 5        # 80 streams at 50 tok/s
    python bench/profile_turns.py --tokens 1 --turns 60 --same    # one chat, growing history
    python bench/profile_turns.py --tokens 1000 --turns 20 --coalesce-ms 20   # with coalescing
    python bench/profile_turns.py --tokens 200 --turns 10 --subscribers 100 --delay 0.002
                                                   # B8's broadcast: 100 readers of one chat

Prints the top functions by own time and by cumulative time; ``--out F`` keeps the .prof file
(otherwise it goes with the benchmark's temporary folder; AGENTIK_BENCH_KEEP=1 keeps that).
cProfile inflates the cost of small functions: read it for where, not for how much.
"""

from __future__ import annotations

import asyncio
import cProfile  # noqa: F401 - documents the dependency
import io
import pstats
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the suite's helpers

import common
from common import TurnClient, spec_text


async def drive(
    port: int,
    tokens: int,
    turns: int,
    health: int,
    streams: int = 0,
    seconds: float = 0,
    same: bool = False,
    subscribers: int = 0,
    delay: float = 0.0,
) -> None:
    async with common.session() as s:
        if subscribers:  # every turn read by ``subscribers`` SSE streams of one conversation
            c = TurnClient(port, s)
            cid = await c.new_conversation()
            for _ in range(turns):
                subs = await asyncio.gather(*(c.open_events(cid) for _ in range(subscribers)))
                reads = [asyncio.ensure_future(x.read_turn()) for x in subs]
                await c.post(cid, spec_text(tokens, delay=delay))
                await asyncio.gather(*reads)
                for x in subs:
                    x.close()
            return
        if streams:
            from load import StreamLoad

            load = StreamLoad("agentik", port, s, streams, tokens=int((seconds + 2) / 0.02))
            await load.start()
            await asyncio.sleep(seconds)
            await load.stop()
        c = TurnClient(port, s)
        cid = await c.new_conversation() if same else None
        for _ in range(turns):
            await c.turn(spec_text(tokens), cid=cid)
        for _ in range(health):
            async with s.get(f"http://{common.HOST}:{port}/health") as r:
                await r.read()


async def main(args: Any) -> dict[str, Any]:
    fake = common.start_fake()
    out = Path(args.out or common.tmpdir() / "agentik.prof")
    port = common.free_port()
    extra = {"AGENTIK_SSE_COALESCE_MS": str(args.coalesce_ms)} if args.coalesce_ms else {}
    env = common.agentik_env(fake.port, port, **extra)
    p = common.Proc(
        [common.PY, "-m", "cProfile", "-o", str(out), "-m", "agentik", "serve"], env, "profiled"
    )
    try:
        common.wait_http(p, port)
        await drive(port, 1, 5, 0)  # warm-up
        await drive(
            port,
            args.tokens,
            args.turns,
            args.health,
            args.streams,
            args.seconds,
            args.same,
            args.subscribers,
            args.delay,
        )
    finally:
        p.stop(timeout=30)
        fake.stop()
    buf = io.StringIO()
    st = pstats.Stats(str(out), stream=buf)
    st.strip_dirs()
    st.sort_stats("tottime").print_stats(args.top)
    st.sort_stats("cumulative").print_stats(args.top)
    print(buf.getvalue())
    return {"profile": str(out)}


def add_args(p: Any) -> None:
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("--turns", type=int, default=200)
    p.add_argument("--health", type=int, default=0)
    p.add_argument("--streams", type=int, default=0, help="concurrent streams at 50 tok/s")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--same", action="store_true", help="all turns on one conversation")
    p.add_argument("--coalesce-ms", type=float, default=0, help="AGENTIK_SSE_COALESCE_MS")
    p.add_argument("--subscribers", type=int, default=0, help="SSE readers of one chat")
    p.add_argument("--delay", type=float, default=0.0, help="s before each token (fake LLM)")
    p.add_argument("--top", type=int, default=35)
    p.add_argument("--out")


if __name__ == "__main__":
    common.cli(main, add_args)
    sys.exit(0)
