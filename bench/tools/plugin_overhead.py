"""What issue #12's safety costs, per tool call and per turn (run by hand, not in the suite).

    python bench/plugin_overhead.py

1. A tool call: ``ToolRegistry.invoke`` of a 3-argument tool with its arguments validated
   against the tool's JSON schema (a jsonschema validator compiled once per tool) vs the same
   registry with validation off (the floor: what invoke did before). µs per call, p50 of
   repeats of 20,000 calls, alternating.
2. The turn hooks: ``ChatAgent.before_turn`` + ``after_turn`` with 3 plugins implementing both,
   each implementation called on its own (``call_each``: isolation and tracing) vs one pluggy
   call per hook (the floor: what the agent did before). µs per turn, p50 of repeats of 20,000.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agentik import hookimpl
from agentik.core.agent import ChatAgent
from agentik.core.testing import EchoLLM, test_plugins
from agentik.core.tools import ToolRegistry, tool

N = 20_000
REPEATS = 7


@tool
def book(city: str, nights: int, breakfast: bool = False) -> str:
    """Book a room."""
    return city


ARGS = '{"city": "Oslo", "nights": 3, "breakfast": true}'


async def tool_calls(validate: bool) -> float:
    registry = ToolRegistry([book])
    if not validate:
        registry._validators["book"] = (None, None)  # the floor: no schema check
    await registry.invoke("book", ARGS)  # compile outside the timing
    began = time.perf_counter_ns()
    for _ in range(N):
        await registry.invoke("book", ARGS)
    return (time.perf_counter_ns() - began) / N / 1000


class Plugin:
    @hookimpl
    def before_turn(self, text: str) -> str:
        return "ctx"

    @hookimpl
    def after_turn(self, user_text: str) -> None:
        return None


async def turn_hooks(isolated: bool) -> float:
    plugins = test_plugins([(f"p{i}", Plugin()) for i in range(3)], builtins=[])
    agent = ChatAgent(store=None, llm=EchoLLM(), hooks=plugins.hook)  # type: ignore[arg-type]
    conv: Any = type("Conv", (), {"id": "c", "agent": agent})()
    hook = plugins.hook
    began = time.perf_counter_ns()
    for _ in range(N):
        if isolated:
            await agent.before_turn(conv, "hello")
            agent.after_turn(conv, "hello", "hi")
        else:  # the old path: one pluggy call per hook
            "\n\n".join(hook.before_turn(conversation=conv, text="hello"))
            hook.after_turn(conversation=conv, user_text="hello", assistant_text="hi")
    return (time.perf_counter_ns() - began) / N / 1000


async def main() -> None:
    for name, measure in (("tool call", tool_calls), ("turn hooks", turn_hooks)):
        ours, floor = [], []
        for _ in range(REPEATS):
            ours.append(await measure(True))
            floor.append(await measure(False))
        a, f = statistics.median(ours), statistics.median(floor)
        print(f"{name}: agentik {a:.2f} µs, floor {f:.2f} µs, +{a - f:.2f} µs ({a / f:.2f}x)")


if __name__ == "__main__":
    asyncio.run(main())
