"""The agent's own HTTP+SSE API under ``/agentik`` (SPEC F3)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentik import hookimpl
from agentik.core.settings import Setting, parse_non_negative_float, parse_positive_float

PREFIX = "/agentik"


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    register(
        Setting(
            "AGENTIK_SSE_HEARTBEAT",
            15.0,
            parse_positive_float,
            "Seconds between SSE keep-alive comments (one timer for all streams).",
        )
    )
    register(
        Setting(
            "AGENTIK_SSE_COALESCE_MS",
            0.0,
            parse_non_negative_float,
            "Milliseconds an SSE stream waits after news to send more events in one write "
            "(fewer writes when many deltas arrive within it; that much more latency).",
        )
    )


def setup(app: Any, agent: Any, settings: Any) -> None:
    from agentik_transport_http.routes import make_subapp

    app.add_subapp(
        PREFIX,
        make_subapp(
            agent, settings["AGENTIK_SSE_HEARTBEAT"], settings["AGENTIK_SSE_COALESCE_MS"] / 1000
        ),
    )


@hookimpl
def register_transports(register: Callable[..., None]) -> None:
    register("http", setup)


@hookimpl
def banner_lines() -> list[str]:
    return [
        f"  POST {PREFIX}/conversations                              -> 201",
        f"  POST {PREFIX}/conversations/{{id}}/messages                -> 202",
        f"  GET  {PREFIX}/conversations/{{id}}/events                  -> SSE",
        f"  GET  {PREFIX}/events                                     -> SSE",
        f"  GET  {PREFIX}/openapi.json",
    ]
