"""Background model work that yields to the user: memory review, reflection, skill mining.

On a local server with one slot (llama.cpp, llama-cpp-python, Ollama with one parallel request)
a call the agent makes for itself queues the user's next turn behind it, and evicts the
conversation from the server's prompt cache (the next turn re-reads the whole conversation).
So a feature does not call the model when a turn ends: it hands the call to
:class:`Background` (``agent.background.submit(...)``), which

- runs the calls one at a time, and only once no user turn has been queued or running for
  ``idle_after`` seconds (``AGENTIK_BACKGROUND_IDLE``);
- cancels the call under way when a user turn starts, and queues it again once (the second
  time it is dropped);
- keeps one waiting call per feature and key (a newer one replaces it: a reflection or a mining
  pass reads the latest turns when it runs), and at most ``max_waiting`` in all (the oldest is
  dropped).

Every drop is logged. Work that calls no model (counting, file bookkeeping) needs none of this:
an ``after_turn`` hook returns it and it runs at once (``agent.jobs``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agentik.core.jobs import JobRunner
from agentik.core.observe import BACKGROUND, CONVERSATION_ID, Observers, turn_scope

log = logging.getLogger(__name__)

#: how often a call cut short by a user turn is queued again before it is dropped
MAX_PREEMPTIONS = 1


@dataclass(eq=False)
class _Work:
    feature: str
    key: str
    run: Callable[[], Awaitable[Any]]
    preempted: int = 0

    @property
    def name(self) -> str:
        return f"{self.feature} ({self.key})" if self.key else self.feature


class Background:
    """The queue of one agent's background model calls (see the module's docstring)."""

    def __init__(
        self,
        jobs: JobRunner,
        busy: Callable[[], bool],
        *,
        idle_after: float = 0.0,
        max_waiting: int = 16,
        observers: Observers | None = None,
    ) -> None:
        self.jobs = jobs
        self.observers = observers if observers is not None else Observers()
        self._busy = busy  # whether a user turn is queued or running (on the agent's backend)
        self.idle_after = idle_after
        self.max_waiting = max_waiting
        self._waiting: deque[_Work] = deque()
        self._runner: asyncio.Task[Any] | None = None
        self._current: tuple[_Work, asyncio.Future[Any]] | None = None
        self._quiet_since = float("-inf")  # loop time of the last turn's start or end
        self._wake = asyncio.Event()
        #: what happened, for the stats and tests: ran, failed, preempted, superseded, dropped
        self.counts: dict[str, int] = dict.fromkeys(
            ("ran", "failed", "preempted", "superseded", "dropped"), 0
        )

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> str | None:
        """The name of the call under way, if any."""
        return self._current[0].name if self._current is not None else None

    def submit(self, feature: str, key: str, run: Callable[[], Awaitable[Any]]) -> None:
        """Run ``run()`` (a model call: it is called, maybe more than once, only when it is its
        turn) once the agent has been idle long enough. ``feature`` names it in the log and
        ``key`` (a conversation id) tells it apart from the same feature's other calls: a call
        still waiting with the same feature and key is replaced by this one."""
        work = _Work(feature, key, run)
        for i, other in enumerate(self._waiting):
            if other.feature == feature and other.key == key:
                self._waiting[i] = work  # keeps its place in the line
                self.counts["superseded"] += 1
                log.debug("background %s: replaced by a newer request", work.name)
                break
        else:
            if len(self._waiting) >= self.max_waiting:
                dropped = self._waiting.popleft()
                self.counts["dropped"] += 1
                log.warning(
                    "background %s dropped: %d model calls were waiting for the user to pause",
                    dropped.name,
                    self.max_waiting,
                )
            self._waiting.append(work)
        self._wake.set()
        if self._runner is None or self._runner.done():
            self._runner = self.jobs.spawn("background model calls", self._drain())

    def turn_started(self) -> None:
        """A user turn starts: the call under way, if any, is cancelled (and queued again)."""
        self._quiet_since = asyncio.get_running_loop().time()
        if self._current is not None:
            work, task = self._current
            if not task.done():
                work.preempted += 1
                task.cancel()
        self._wake.set()

    def turn_ended(self) -> None:
        """A conversation's turns are over: the idle time starts now."""
        self._quiet_since = asyncio.get_running_loop().time()
        self._wake.set()

    async def _drain(self) -> None:
        # started from whichever turn submitted first: its ids are not this work's (JSON logs)
        turn_scope.set(None)
        loop = asyncio.get_running_loop()
        while self._waiting:
            self._wake.clear()
            if self._busy():
                await self._wake.wait()
                continue
            left = self._quiet_since + self.idle_after - loop.time()
            if left > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), left)
                continue
            await self._run(self._waiting.popleft())

    async def _run(self, work: _Work) -> None:
        span = None
        if self.observers:  # a root: it runs long after the turn that asked for it
            attributes = {CONVERSATION_ID: work.key} if work.key else {}
            span = self.observers.start(BACKGROUND, work.feature, attributes, root=True)
        error: str | None = "cancelled"
        try:
            error = await self._await(work)
        finally:
            if span is not None:
                span.end(error)

    async def _await(self, work: _Work) -> str | None:
        """Run ``work`` once; None when it succeeded, else what stopped it."""
        task = asyncio.ensure_future(work.run())
        self._current = (work, task)
        try:
            await asyncio.wait([task])
        finally:
            self._current = None
            task.cancel()  # a no-op once done; else the runner itself is cancelled (shutdown)
        if task.cancelled():
            self.counts["preempted"] += 1
            if any(w.feature == work.feature and w.key == work.key for w in self._waiting):
                self.counts["superseded"] += 1  # a newer request of the same is waiting
            elif work.preempted <= MAX_PREEMPTIONS:
                log.info("background %s: cut short by a user turn; it runs again later", work.name)
                self._waiting.appendleft(work)
            else:
                self.counts["dropped"] += 1
                log.warning("background %s dropped: cut short by user turns again", work.name)
            return "preempted"
        error = task.exception()
        if error is not None:
            self.counts["failed"] += 1
            log.error("background %s failed", work.name, exc_info=error)
            return type(error).__name__
        self.counts["ran"] += 1
        return None
