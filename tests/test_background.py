"""Background model calls yield to user turns (agentik.core.background): they run once the agent
has been idle a while, never while a turn is queued or running, one at a time; a turn that starts
cuts the call under way short; waiting calls are replaced or dropped, never piled up."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from agentik.core.agent import ChatAgent
from agentik.core.background import Background
from agentik.core.jobs import JobRunner
from agentik.core.store import MemoryStore
from agentik.core.testing import ScriptedLLM, run_turn
from agentik.core.types import TextPart


class Clock:
    """What ran, and when (loop time)."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, float]] = []
        self.started: list[str] = []

    def work(self, name: str, seconds: float = 0.0) -> Any:
        async def run() -> None:
            self.started.append(name)
            await asyncio.sleep(seconds)
            self.ran.append((name, asyncio.get_running_loop().time()))

        return run


@pytest.fixture
async def jobs() -> Any:
    runner = JobRunner()
    yield runner
    await runner.close()


async def test_calls_wait_for_the_idle_time_and_for_no_turn_under_way(jobs):
    busy = [True]
    bg = Background(jobs, lambda: busy[0], idle_after=0.2)
    clock = Clock()
    loop = asyncio.get_running_loop()
    bg.turn_started()
    bg.submit("review", "c1", clock.work("review"))
    await asyncio.sleep(0.3)
    assert clock.ran == []  # a turn is under way
    busy[0] = False
    ended = loop.time()
    bg.turn_ended()
    await jobs.wait_idle()
    (name, at), = clock.ran  # fmt: skip
    assert name == "review" and at - ended >= 0.2


async def test_one_at_a_time_in_order(jobs):
    bg = Background(jobs, lambda: False)
    clock = Clock()
    for name in ("a", "b", "c"):
        bg.submit(name, "", clock.work(name, 0.02))
    await asyncio.sleep(0.01)
    assert clock.started == ["a"]
    await jobs.wait_idle()
    assert [n for n, _ in clock.ran] == ["a", "b", "c"]


async def test_a_turn_cuts_the_call_under_way_short_it_runs_again_once(jobs, caplog):
    caplog.set_level(logging.INFO, "agentik.core.background")
    busy = [False]
    bg = Background(jobs, lambda: busy[0])
    clock = Clock()
    bg.submit("reflection", "c1", clock.work("reflection", 0.2))
    await asyncio.sleep(0.05)
    assert clock.started == ["reflection"]
    for cut in range(2):  # a turn starts while it runs, twice
        busy[0] = True
        bg.turn_started()
        await asyncio.sleep(0.01)
        assert bg.running is None and bg.counts["preempted"] == cut + 1
        busy[0] = False
        bg.turn_ended()
        await asyncio.sleep(0.05)
    await jobs.wait_idle()
    assert clock.ran == [] and clock.started == ["reflection"] * 2  # once more, then dropped
    assert bg.counts["dropped"] == 1
    assert "cut short by a user turn; it runs again later" in caplog.text
    assert "reflection (c1) dropped: cut short by user turns again" in caplog.text


async def test_a_newer_call_replaces_the_waiting_one_and_the_oldest_is_dropped(jobs, caplog):
    busy = [True]
    bg = Background(jobs, lambda: busy[0], max_waiting=3)
    clock = Clock()
    bg.submit("review", "c1", clock.work("review c1 first"))
    bg.submit("review", "c2", clock.work("review c2"))
    bg.submit("review", "c1", clock.work("review c1 second"))  # takes the first one's place
    assert bg.waiting == 2 and bg.counts["superseded"] == 1
    bg.submit("mining", "c1", clock.work("mining c1"))
    with caplog.at_level(logging.WARNING):
        bg.submit("reflection", "c3", clock.work("reflection c3"))  # one too many
    assert "review (c1) dropped: 3 model calls were waiting" in caplog.text
    busy[0] = False
    bg.turn_ended()
    await jobs.wait_idle()
    assert [n for n, _ in clock.ran] == ["review c2", "mining c1", "reflection c3"]


async def test_a_failing_call_is_logged_and_the_next_runs(jobs, caplog):
    bg = Background(jobs, lambda: False)
    clock = Clock()

    async def boom() -> None:
        raise RuntimeError("no")

    bg.submit("review", "c1", boom)
    bg.submit("review", "c2", clock.work("next"))
    with caplog.at_level(logging.ERROR):
        await jobs.wait_idle()
    assert "background review (c1) failed" in caplog.text and "RuntimeError: no" in caplog.text
    assert [n for n, _ in clock.ran] == ["next"] and bg.counts["failed"] == 1


async def test_a_turn_in_any_conversation_holds_them_back():
    """All conversations share the one backend: a turn in another conversation holds back
    (and cuts short) the background call of this one."""
    llm = ScriptedLLM(["slow "] * 20, delay=0.02)
    agent = ChatAgent(store=MemoryStore(), llm=llm, background_idle=0.0)
    clock = Clock()
    try:
        a = await agent.create_conversation()
        b = await agent.create_conversation()
        await b.send([TextPart("a long reply, please")])
        agent.background.submit("review", a.id, clock.work("review of a"))
        await asyncio.sleep(0.1)
        assert b.busy and clock.started == []  # b's turn is under way
        await b.wait_idle()
        await agent.jobs.wait_idle()
        assert [n for n, _ in clock.ran] == ["review of a"]
        # and a turn that starts cuts the call under way short
        agent.background.submit("review", a.id, clock.work("slow review of a", 5))
        await asyncio.sleep(0.05)
        assert agent.background.running == f"review ({a.id})"
        await run_turn(a, "hello")
        assert agent.background.counts["preempted"] == 1
    finally:
        await agent.close()
