"""The errors that stop start-up, and how a command tells one: one line on stderr."""

from __future__ import annotations

import os
import sys


class StartupError(Exception):
    """Start-up cannot go on; the message says what to set or fix."""


class PluginError(StartupError):
    """Plugin code failed at start-up; the message names the plugin, what it was doing and the
    error (one line). The original exception is its ``__cause__``."""

    def __init__(self, plugin: str, what: str, error: BaseException) -> None:
        super().__init__(f"plugin {plugin}: {what} failed: {type(error).__name__}: {error}")
        self.plugin = plugin


class BackendError(Exception):
    """A backend that cannot be chosen: unknown, registered twice, or missing its extra."""


def fail(message: str, error: BaseException | None = None, *, traceback: bool = False) -> int:
    """One line on stderr and exit status 2; the traceback of the plugin code behind it only
    with ``AGENTIK_STRICT_PLUGINS=1`` or debug logging."""
    if error is not None and (traceback or _wants_traceback()):
        import traceback as tb

        cause = error.__cause__ or error
        tb.print_exception(type(cause), cause, cause.__traceback__, file=sys.stderr)
    print(f"agentik: error: {message}", file=sys.stderr)
    return 2


def _wants_traceback() -> bool:
    from agentik.core.settings import parse_bool

    strict = os.environ.get("AGENTIK_STRICT_PLUGINS", "").strip()
    try:
        strict_on = bool(strict) and parse_bool(strict)
    except ValueError:
        strict_on = False
    return strict_on or os.environ.get("AGENTIK_LOG_LEVEL", "").strip().lower() == "debug"
