"""Where an in-process turn's time goes (B3, B10): the agent of bench/inproc.py (built like
``create_app`` builds it, ScriptedLLM, SQLite file DB or ``:memory:``) under cProfile.

    python bench/profile_inproc.py                    # 3,000 turns on one conversation, file DB
    python bench/profile_inproc.py --memory           # the same on :memory: (no fsync)

Prints the top functions by own time and by cumulative time. Only the event-loop thread is
profiled (the fsync thread is not). cProfile inflates small functions: read it for where.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the suite's helpers

import common
from inproc import agentik_turns, open_agent


async def run(memory: bool, turns: int) -> cProfile.Profile:
    path = ":memory:" if memory else str(common.tmpdir() / "profile-inproc.db")
    agent = await open_agent(path)
    conv = await agent.create_conversation()
    await agentik_turns(conv, 50, [], [])  # warm-up
    prof = cProfile.Profile()
    prof.enable()
    await agentik_turns(conv, turns, [], [])
    prof.disable()
    await agent.close()
    return prof


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory", action="store_true", help="use a :memory: database")
    parser.add_argument("--turns", type=int, default=3000)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    prof = asyncio.run(run(args.memory, args.turns))
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(args.top)
    st.sort_stats("cumulative").print_stats(args.top)
    print(buf.getvalue())


if __name__ == "__main__":
    main()
