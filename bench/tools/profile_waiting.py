"""Where the memory of turns waiting for approval goes (B27's question): in process, N
conversations with one turn each — plain (idle) or held for approval (waiting) — on a real
SQLite file, the Python heap's growth by file (tracemalloc). What it does not see (SQLite's page
cache, the allocator) is the rest of B27's RSS difference.

    python bench/tools/profile_waiting.py [--n 400]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aiohttp.test_utils import TestServer

from agentik.core.app import AGENT
from agentik.core.llm import ToolCallRequest
from agentik.core.testing import ScriptedLLM, make_app
from agentik.core.types import TextPart


async def fill(n: int, wait: bool) -> None:
    steps = [[ToolCallRequest(f"c{i}", "write_file", '{"path": "x"}')] for i in range(n)]
    env = {
        "AGENTIK_DB_PATH": str(Path(tempfile.mkdtemp()) / "a.db"),
        "AGENTIK_TOOL_APPROVAL": "all",
        "AGENTIK_MEMORY_BACKEND": "off",
        "AGENTIK_AUTO_TITLE": "0",
        "AGENTIK_REFLECTION_INTERVAL": "0",
    }
    builtins = ("agentik_transport_http", "agentik_approvals")
    app = make_app(llm=ScriptedLLM(*(steps if wait else [])), builtins=builtins, env=env)
    server = TestServer(app)
    await server.start_server()
    agent = app[AGENT]
    gc.collect()
    before = tracemalloc.take_snapshot()
    for _ in range(n):
        conv = await agent.create_conversation()
        await conv.send([TextPart("hello")])
        await conv.wait_idle()
    gc.collect()
    diff = tracemalloc.take_snapshot().compare_to(before, "filename")
    total = sum(d.size_diff for d in diff)
    print(f"{'waiting' if wait else 'idle'}: {total / 1024:.0f} KiB, {total / n:.0f} B each")
    for d in diff[:8]:
        print(f"   {d.size_diff / 1024:7.0f} KiB  {d.traceback[0].filename}")
    await server.close()


async def main(n: int) -> None:
    tracemalloc.start(1)
    await fill(n, wait=False)
    await fill(n, wait=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=400)
    asyncio.run(main(parser.parse_args().n))
