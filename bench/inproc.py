"""Building an in-process agentik agent the way ``create_app`` does (plugins, settings, hooks),
with a :class:`~agentik.core.testing.ScriptedLLM` at the backend boundary."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "floors"))

from agentik.core.agent import ChatAgent
from agentik.core.app import build_agent, load_settings
from agentik.core.testing import ScriptedLLM, test_plugins
from agentik.core.types import TextPart

HI = [TextPart("hi")]


class LeanScriptedLLM(ScriptedLLM):
    """ScriptedLLM that does not keep every input it received (a 1,000-turn run would grow it)."""

    def __init__(self) -> None:
        super().__init__()
        self.received = _Discard()


class _Discard(list):  # type: ignore[type-arg]
    def append(self, _item: Any) -> None:
        pass


async def open_agent(db_path: str) -> ChatAgent:
    """The agent ``create_app`` would build (the HTTP transport plugin and the pluggy hook relay
    included), on ``db_path``, opened."""
    pm = test_plugins()
    settings = load_settings(pm, {"AGENTIK_DB_PATH": db_path})
    agent = build_agent(pm, settings, LeanScriptedLLM())
    await agent.open()
    return agent


async def agentik_turns(conv: Any, n: int, cpu: list[float], wall: list[float]) -> None:
    """``n`` turns, each ``send`` + ``wait_idle``; appends µs of process CPU and wall per turn."""
    pt, pc = time.process_time, time.perf_counter
    for _ in range(n):
        c0, w0 = pt(), pc()
        await conv.send(HI)
        await conv.wait_idle()
        cpu.append((pt() - c0) * 1e6)
        wall.append((pc() - w0) * 1e6)


async def floor_turns(loop: Any, cid: str, n: int, cpu: list[float], wall: list[float]) -> None:
    pt, pc = time.process_time, time.perf_counter
    for _ in range(n):
        c0, w0 = pt(), pc()
        await loop.turn(cid, "hi")
        cpu.append((pt() - c0) * 1e6)
        wall.append((pc() - w0) * 1e6)
