"""Background work that never blocks a turn: one-off tasks and periodic jobs.

Failures are logged, never raised into a conversation; everything is cancelled at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)


class JobRunner:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._periodic: set[asyncio.Task[Any]] = set()
        self._closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, name: str, work: Awaitable[Any]) -> asyncio.Task[Any] | None:
        """Run ``work`` in the background; its failure is logged with ``name``."""
        if self._closed:
            if asyncio.iscoroutine(work):
                work.close()
            return None
        task = asyncio.ensure_future(self._guard(name, work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if asyncio.iscoroutine(work):  # cancelled before it started: not "never awaited"
            task.add_done_callback(lambda _: work.close())
        return task

    def every(self, name: str, interval: float, run: Callable[[], Awaitable[Any]]) -> None:
        """Call ``run()`` every ``interval`` seconds, the first time after one interval."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval)
                await self._guard(name, run())

        if not self._closed:
            self._periodic.add(asyncio.ensure_future(loop()))

    @staticmethod
    async def _guard(name: str, work: Awaitable[Any]) -> Any:
        try:
            return await work
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background job %s failed", name)
            return None

    async def wait_idle(self) -> None:
        """Wait until the one-off tasks running now are done (for tests and debug endpoints)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def close(self) -> None:
        self._closed = True
        tasks = self._tasks | self._periodic
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
