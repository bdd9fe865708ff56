"""Prometheus metrics (``AGENTIK_METRICS=1``): ``GET /metrics`` in the text format, behind the
API key like every route, or on its own loopback port (``AGENTIK_METRICS_PORT``).

What turns, model calls, tool calls and background work do is counted by an observer
(``register_observers``); queues, live conversations and open streams are read when scraped.
``prometheus_client`` is imported only when the plugin is on. docs/observability.md lists the
metrics.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from agentik.core import settings as cfg
from agentik.core.settings import Setting, Settings
from agentik.hookspecs import hookimpl

log = logging.getLogger(__name__)

STATE = "agentik_metrics"  # agent.state: the plugin's Metrics
ENABLE = Setting(
    "AGENTIK_METRICS",
    False,
    cfg.parse_bool,
    "1 serves Prometheus metrics: `GET /metrics` (behind the API key), or on AGENTIK_METRICS_PORT.",
)
PORT = Setting(
    "AGENTIK_METRICS_PORT",
    None,
    cfg.parse_port,
    "With AGENTIK_METRICS=1: serve `GET /metrics` on this port of 127.0.0.1 (no key) instead "
    "of the main server.",
)


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    register(ENABLE)
    register(PORT)


@hookimpl
def register_observers(register: Callable[..., None], agent: Any, settings: Settings) -> None:
    if not settings["AGENTIK_METRICS"]:
        return
    try:
        from agentik_metrics.collector import Metrics
    except ImportError as e:
        from agentik.api import StartupError

        raise StartupError(
            "AGENTIK_METRICS=1 needs prometheus-client: "
            f"pip install 'agentik-runtime[metrics]' ({e})"
        ) from e

    metrics = agent.state[STATE] = Metrics(agent)
    register(metrics)


def _routes(app: Any, agent: Any, settings: Settings) -> None:
    if settings["AGENTIK_METRICS"] and settings["AGENTIK_METRICS_PORT"] is None:
        from agentik_metrics.collector import handler

        app.router.add_get("/metrics", handler(agent))


@hookimpl
def register_transports(register: Callable[..., None]) -> None:
    register("metrics", _routes)


@hookimpl
def register_services(register: Callable[..., None], agent: Any, settings: Settings) -> None:
    port = settings["AGENTIK_METRICS_PORT"]
    if not settings["AGENTIK_METRICS"] or port is None:
        return

    @contextlib.asynccontextmanager
    async def own_port() -> AsyncIterator[None]:
        from aiohttp import web

        from agentik_metrics.collector import handler

        app = web.Application()
        app.router.add_get("/metrics", handler(agent))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", port).start()
            yield
        finally:
            await runner.cleanup()

    register("metrics port", own_port)


@hookimpl
def banner_lines(settings: Settings) -> list[str] | None:
    if not settings["AGENTIK_METRICS"]:
        return None
    port = settings["AGENTIK_METRICS_PORT"]
    where = f"http://127.0.0.1:{port}/metrics" if port is not None else "GET /metrics"
    return [f"metrics: {where} (Prometheus)"]
