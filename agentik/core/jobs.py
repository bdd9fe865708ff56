"""Background work that never blocks a turn: one-off tasks and periodic jobs.

Failures are logged, never raised into a conversation; everything is cancelled at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from agentik.core.failures import log_failure

log = logging.getLogger(__name__)


class Leader(Protocol):
    """Which instance runs a periodic job when several share one database (the store's
    :meth:`~agentik.core.store.Store.leader`; absent on one process, where every job runs)."""

    async def lead(self, job: str) -> asyncio.Event | None:
        """None: another instance runs ``job`` now (ask again next period). Else this one
        runs it; the event is set when it loses the lead (then it stops at once)."""

    async def close(self) -> None:
        """Give every lead up (another instance takes each at its next period)."""


class JobRunner:
    def __init__(self, leader: Leader | None = None) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._periodic: set[asyncio.Task[Any]] = set()
        self._closed = False
        #: with many instances on one database, the one that runs each periodic job
        self.leader = leader

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

    def spawn_call(self, name: str, run: Callable[[], Awaitable[Any]]) -> None:
        """:meth:`spawn` what ``run()`` returns; ``run`` raising at once is logged like a job
        that fails later."""
        try:
            work = run()
        except Exception as e:
            log_failure(name, e, log)
            return
        self.spawn(name, work)

    def every(
        self,
        name: str,
        interval: float,
        run: Callable[[], Awaitable[Any]],
        *,
        one_instance: bool = False,
    ) -> None:
        """Call ``run()`` every ``interval`` seconds, the first time after one interval. A run
        that fails (``run`` itself raising included) is logged, and the next one comes. With
        ``one_instance`` (the work of the whole agent, plugins' jobs) and a :attr:`leader`, only
        on the instance that leads ``name``; without, on each (this instance's own upkeep)."""
        leader = self.leader if one_instance else None

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval)
                lost = None
                if leader is not None:
                    lost = await self._lead(name)
                    if lost is None:
                        continue  # another instance runs it
                try:
                    work = run()
                except Exception as e:
                    log_failure(name, e, log)
                    continue
                if lost is None:
                    await self._guard(name, work)
                else:
                    await self._led(name, work, lost)

        if not self._closed:
            self._periodic.add(asyncio.ensure_future(loop()))

    async def _lead(self, name: str) -> asyncio.Event | None:
        if self.leader is None:
            return None
        try:
            return await self.leader.lead(name)
        except Exception as e:  # the database is away: no one may be sure to lead
            log_failure(f"{name}: taking the lead", e, log)
            return None

    async def _led(self, name: str, work: Awaitable[Any], lost: asyncio.Event) -> None:
        """Run ``work`` until it ends or this instance loses the lead of ``name``."""
        running = asyncio.ensure_future(self._guard(name, work))
        losing = asyncio.ensure_future(lost.wait())
        try:
            await asyncio.wait({running, losing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            losing.cancel()
            if not running.done():  # lost (or closing): another instance runs it from now
                if lost.is_set():
                    log.warning("%s: stopped, another instance leads it now", name)
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running

    @staticmethod
    async def _guard(name: str, work: Awaitable[Any]) -> Any:
        try:
            if not inspect.isawaitable(work):
                raise TypeError(f"it returned {type(work).__name__}, not an awaitable")
            return await work
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log_failure(name, e, log)
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
        if self.leader is not None:
            await self.leader.close()
