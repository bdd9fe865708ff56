"""How plugin code that fails at run time is logged: one line that names the plugin (the
traceback too at debug level, for its author). Imported by the core's modules that call plugin
code; it imports nothing of agentik."""

from __future__ import annotations

import logging

log = logging.getLogger("agentik.core.plugins")


def one_line(e: BaseException, limit: int = 500) -> str:
    """``Type: message`` on one line (pluggy's validation errors span several), cut at
    ``limit`` characters."""
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def log_failure(what: str, error: BaseException, logger: logging.Logger = log) -> None:
    """One log line, ``<what> failed: <Type>: <message>`` (``what`` names the plugin); the
    traceback is added at debug level (``AGENTIK_LOG_LEVEL=debug``), for the plugin's author."""
    debug = logger.isEnabledFor(logging.DEBUG)
    logger.error("%s failed: %s", what, one_line(error), exc_info=error if debug else None)
