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
    """Every operation of the API, read from its OpenAPI document (so the two cannot drift)."""
    import json
    from importlib import resources

    doc = json.loads(resources.files(__name__).joinpath("openapi.json").read_text())
    lines = []
    for path, ops in doc["paths"].items():
        if not path.startswith(PREFIX):
            continue
        for method, op in ops.items():
            if method == "parameters":
                continue
            ok = next(s for s in op["responses"] if s.startswith("2"))
            sse = "text/event-stream" in op["responses"][ok].get("content", {})
            route = f"  {method.upper():<4} {path}"  # PATCH and DELETE are longer than GET
            lines.append(f"{route:<50} -> {'SSE' if sse else ok}")
    return lines
