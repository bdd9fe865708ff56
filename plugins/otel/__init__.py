"""OpenTelemetry traces and metrics (``AGENTIK_OTEL=1``, or on by itself when
``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set): a span per
turn, model call, tool call,
compaction, ``before_turn`` work and background model call, and the conventions' client
metrics (``gen_ai.client.operation.duration``, ``gen_ai.client.token.usage``), following the
GenAI semantic conventions, exported over OTLP/HTTP as the standard ``OTEL_*`` variables say.

The ``traceparent`` of the request that sent a message becomes its turn's parent; the model
requests of the ``openai`` backend carry the turn's. Message text is recorded only with
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``. The SDK is imported only when the
plugin is on. docs/observability.md shows a setup.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

from agentik.core import settings as cfg
from agentik.core.settings import Setting, Settings
from agentik.hookspecs import hookimpl

STATE = "agentik_otel"  # agent.state: the plugin's Tracing
METRICS = "agentik_otel_metrics"  # and its Metrics, unless OTEL_METRICS_EXPORTER=none
ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
ENABLE = Setting(
    "AGENTIK_OTEL",
    None,
    cfg.parse_bool,
    "1 exports OpenTelemetry traces and GenAI metrics over OTLP/HTTP (the standard `OTEL_*` "
    "variables say where; default http://localhost:4318); unset: on when "
    "OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set; 0: off. "
    "See docs/observability.md.",
)


def enabled(settings: Settings) -> bool:
    on = settings["AGENTIK_OTEL"]
    return bool(on) if on is not None else any(os.environ.get(v, "").strip() for v in ENDPOINTS)


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    register(ENABLE)


@hookimpl
def register_observers(register: Callable[..., None], agent: Any, settings: Settings) -> None:
    if not enabled(settings):
        return
    try:
        from agentik_otel.metrics import Metrics
        from agentik_otel.tracing import Tracing, resource
    except ImportError as e:
        from agentik.api import StartupError

        raise StartupError(
            f"AGENTIK_OTEL (or OTEL_EXPORTER_OTLP_*) needs the OpenTelemetry SDK: "
            f"pip install 'agentik-runtime[otel]' ({e})"
        ) from e

    tracing = agent.state[STATE] = Tracing.from_environment()
    register(tracing)
    metrics = Metrics.from_environment(resource())
    if metrics is not None:
        agent.state[METRICS] = metrics
        register(metrics)


def _incoming(app: Any, agent: Any, settings: Settings) -> None:
    if enabled(settings):
        from agentik_otel.tracing import keep_traceparent

        app.middlewares.append(keep_traceparent)


@hookimpl
def register_transports(register: Callable[..., None]) -> None:
    register("otel", _incoming)


@hookimpl
def register_services(register: Callable[..., None], agent: Any, settings: Settings) -> None:
    if not enabled(settings):
        return

    @contextlib.asynccontextmanager
    async def exporting() -> AsyncIterator[None]:
        try:
            yield
        finally:  # the spans still batched go out before the process ends
            for key in (STATE, METRICS):
                done = agent.state.get(key)
                if done is not None:  # a blocking flush: off the loop
                    await asyncio.to_thread(done.provider.shutdown)

    register("otel exporter", exporting)


@hookimpl
def banner_lines(settings: Settings) -> list[str] | None:
    if not enabled(settings):
        return None
    where = next((os.environ[v] for v in reversed(ENDPOINTS) if os.environ.get(v)), None)
    return [f"traces: OpenTelemetry OTLP/HTTP to {where or 'http://localhost:4318'}"]
