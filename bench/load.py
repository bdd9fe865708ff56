"""Streaming load: ``n`` clients, each running turn after turn at 50 tokens/s (the fake LLM sleeps
20 ms before each chunk), against agentik (one conversation per client, its SSE stream kept
open, POST per turn) or the minimal relay (one GET /relay per turn). Records the arrival time of
every token, so inter-token gaps can be taken over any window; and calibrates ``n`` to a target
CPU use of the server process."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

from common import CpuMeter, RawSSE, TurnClient, spec_text

DELAY = 0.02  # 50 tok/s


class StreamLoad:
    def __init__(
        self, kind: str, port: int, session: Any, n: int, tokens: int = 100, ramp: float = 1.0
    ) -> None:
        self.kind, self.port, self.session = kind, port, session
        self.n, self.tokens, self.ramp = n, tokens, ramp
        self.text = spec_text(tokens, delay=DELAY)
        self.turn_times: list[list[float]] = []  # per finished/ongoing turn: token arrival times
        self.errors = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = False
        self._streams: list[RawSSE] = []

    async def start(self) -> None:
        if self.kind == "agentik":
            c = TurnClient(self.port, self.session)
            sem = asyncio.Semaphore(50)

            async def setup() -> tuple[str, RawSSE]:
                async with sem:
                    cid = await c.new_conversation()
                    return cid, await c.open_events(cid)

            pairs = await asyncio.gather(*(setup() for _ in range(self.n)))
            self._streams = [p[1] for p in pairs]
            self._tasks = [
                asyncio.create_task(self._agentik_loop(c, cid, sse, i))
                for i, (cid, sse) in enumerate(pairs)
            ]
        else:
            self._tasks = [asyncio.create_task(self._relay_loop(i)) for i in range(self.n)]

    async def _pause(self, i: int) -> None:  # spread the starts over the ramp
        await asyncio.sleep(self.ramp * i / max(1, self.n) + random.random() * 0.01)

    async def _agentik_loop(self, c: TurnClient, cid: str, sse: RawSSE, i: int) -> None:
        await self._pause(i)
        while not self._stop:
            times: list[float] = []
            self.turn_times.append(times)
            try:
                await c.post(cid, self.text)
                await sse.read_turn(times)
            except Exception:
                self.errors += 1
                if self._stop:
                    return
                await asyncio.sleep(0.5)

    async def _relay_loop(self, i: int) -> None:
        await self._pause(i)
        path = "/relay?text=" + self.text.replace(" ", "%20")
        while not self._stop:
            times: list[float] = []
            self.turn_times.append(times)
            sse = None
            try:
                sse = await RawSSE.open(self.port, path)
                await sse.read_turn(times)
            except Exception:
                self.errors += 1
                if self._stop:
                    return
                await asyncio.sleep(0.5)
            finally:
                if sse is not None:
                    sse.close()

    def gaps_ms(self, t0: float, t1: float) -> list[float]:
        """Inter-token gaps (ms) of tokens that arrived in [t0, t1] (the first of a turn has no
        gap: that is TTFT, not inter-token)."""
        out: list[float] = []
        for times in self.turn_times:
            prev = None
            for t in times:
                if prev is not None and t0 <= t <= t1:
                    out.append((t - prev) * 1e3)
                prev = t
        return out

    def tokens_between(self, t0: float, t1: float) -> int:
        return sum(1 for times in self.turn_times for t in times if t0 <= t <= t1)

    async def stop(self) -> None:
        self._stop = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        for s in self._streams:
            s.close()
        await asyncio.sleep(0.3)  # let the server notice the disconnects


async def measure_util(pid: int, seconds: float) -> float:
    with CpuMeter(pid) as m:
        await asyncio.sleep(seconds)
    return m.util


async def calibrated_load(
    kind: str,
    port: int,
    pid: int,
    session: Any,
    target: float,
    first: int = 40,
    tokens: int = 100,
    limit: int = 2000,
) -> tuple[StreamLoad, float]:
    """Start a load, measure the server's CPU use, restart it scaled to ``target`` (fraction of
    one core). Returns the running load and its measured CPU use."""
    load = StreamLoad(kind, port, session, first, tokens)
    await load.start()
    await asyncio.sleep(load.ramp + 0.5)
    util = await measure_util(pid, 1.5)
    await load.stop()
    n = max(1, min(limit, round(first * target / max(util, 1e-3))))
    load = StreamLoad(kind, port, session, n, tokens)
    await load.start()
    await asyncio.sleep(load.ramp + 0.5)
    util = await measure_util(pid, 1.0)
    return load, util


def now() -> float:
    return time.perf_counter()
