"""``/health`` (liveness) and ``/health/ready`` (readiness), for orchestrators and load
balancers (``docs/operations.md`` has a Kubernetes example).

Liveness says only that the process answers: restarting it would not help a full disk.
Readiness says whether requests should be sent here now. It is not ready while the server stops,
while the database refuses writes (a write probe, run at most every ``PROBE_INTERVAL`` seconds
however often it is asked), for ``ERROR_WINDOW`` seconds after a request failed on storage (a
probe may pass on a full disk while bigger writes fail), and while turns whose end the database
refused wait to be recorded.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from aiohttp import web

from agentik.core import security

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent

#: seconds a write probe's result is reused
PROBE_INTERVAL = 5.0
#: seconds a storage error answered to a client keeps the server not ready
ERROR_WINDOW = 10.0
#: the agent_state key the probe writes
PROBE_KEY = "ready_probe"
NO_STORE = {"Cache-Control": "no-store"}


class Readiness:
    """What ``/health/ready`` answers, for one app."""

    def __init__(self, agent: ChatAgent) -> None:
        self.agent = agent
        self.stopping = False
        self.probe_interval = PROBE_INTERVAL
        self.error_window = ERROR_WINDOW
        self._storage_error: tuple[float, str] | None = None  # (loop time, what failed)
        self._probe: tuple[float, str | None] | None = None  # (loop time, failure or None)
        self._probing: asyncio.Future[str | None] | None = None

    def storage_failed(self, error: BaseException) -> None:
        """A request failed on storage (answered 503 ``storage_unavailable``)."""
        self._storage_error = (asyncio.get_running_loop().time(), f"{error}")

    async def reasons(self) -> list[str]:
        """Why the server is not ready; empty when it is."""
        if self.stopping:
            return ["shutting down"]
        now = asyncio.get_running_loop().time()
        reasons = []
        probe = await self._probe_result(now)
        if probe is not None:
            reasons.append(f"the database refuses writes: {probe}")
        if self._storage_error is not None and now - self._storage_error[0] < self.error_window:
            reasons.append(f"a request failed on storage: {self._storage_error[1]}")
        if self.agent.unrecorded_ends:
            reasons.append(f"{self.agent.unrecorded_ends} turn end(s) wait for the database")
        return reasons

    async def _probe_result(self, now: float) -> str | None:
        if self._probe is not None and now - self._probe[0] < self.probe_interval:
            return self._probe[1]
        if self._probing is None:  # one probe at a time: callers meanwhile share it
            self._probing = asyncio.ensure_future(self._write_probe())
        probing = self._probing
        try:
            failure = await asyncio.shield(probing)
        finally:
            if self._probing is probing and probing.done():
                self._probing = None
        self._probe = (now, failure)
        return failure

    async def _write_probe(self) -> str | None:
        try:
            await self.agent.store.write_state(PROBE_KEY, datetime.now(UTC).isoformat())
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return None


def add_routes(app: web.Application, agent: ChatAgent, ready: Readiness) -> None:
    """``GET /health`` and ``GET /health/ready``, open without a key."""

    @security.public
    async def liveness(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "agent": agent.id})

    @security.public
    async def readiness(request: web.Request) -> web.Response:
        reasons = await ready.reasons()
        if reasons:
            body = {"status": "unavailable", "reasons": reasons}
            return web.json_response(body, status=503, headers=NO_STORE)
        return web.json_response({"status": "ready"}, headers=NO_STORE)

    app.router.add_get("/health", liveness)
    app.router.add_get("/health/ready", readiness)
