"""Two in-agent tools for tests that need a call that works and one that fails, and the plugin
that registers them (``plugins=[("t", Tools())]``)."""

from __future__ import annotations

from agentik import hookimpl
from agentik.core.tools import tool


@tool
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


@tool
def boom() -> str:
    """Fail."""
    raise RuntimeError("no")


class Tools:
    @hookimpl
    def register_tools(self, register):
        register(add)
        register(boom)
