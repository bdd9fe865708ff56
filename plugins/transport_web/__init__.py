"""The web chat page (SPEC F21): a page at ``/`` (``AGENTIK_WEB_PATH``) on the same port, built
only on the agent's own HTTP+SSE API (``/agentik``). Its files (plain ES modules and CSS, no
build step) ship inside this package and are served with a Content-Security-Policy that allows
only the page's own origin. ``docs/web.md`` describes the page.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentik import hookimpl
from agentik.core.settings import Setting, Settings

PATH = "AGENTIK_WEB_PATH"


def parse_page_path(raw: str) -> str:
    """A URL path ending in ``/`` (added when missing); never inside the API's ``/agentik``."""
    path = raw.strip()
    if not path.startswith("/") or any(c in path for c in " ?#{}%\\") or "//" in path:
        raise ValueError("must be a URL path such as / or /chat/ (no spaces, query or braces)")
    if any(part in (".", "..") for part in path.split("/")):
        raise ValueError("must not contain . or .. segments")
    path = path.rstrip("/") + "/"
    if path.startswith("/agentik/") or path == "/health/":
        raise ValueError("must not be inside /agentik or /health, where the API lives")
    return path


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    register(
        Setting(
            PATH,
            "/",
            parse_page_path,
            "URL path of the web chat page (its files are in assets/ below it). Off: "
            "AGENTIK_DISABLE_PLUGINS=agentik_transport_web.",
        )
    )


def setup(app: Any, agent: Any, settings: Settings) -> None:
    from agentik_transport_web.routes import add_routes

    add_routes(app, settings[PATH])


@hookimpl
def register_transports(register: Callable[..., None]) -> None:
    register("web", setup)


@hookimpl
def banner_lines(settings: Settings) -> list[str]:
    return [f"  GET  {settings[PATH]:<43} -> the web chat page"]
