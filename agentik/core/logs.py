"""How ``agentik serve`` writes its log: lines for people, or JSON for a log pipeline
(``AGENTIK_LOG_FORMAT=json``: one object per line, with the running turn's ids)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from agentik.core.observe import turn_scope

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message"}``, plus ``conversation_id``, ``turn_id`` and
    ``trace_id`` when the line is logged inside a turn (``observe.turn_scope``), and
    ``exception`` with its traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        scope = turn_scope.get()
        if scope is not None:
            line["conversation_id"] = scope.conversation_id
            line["turn_id"] = scope.turn_id
            if scope.trace_id is not None:
                line["trace_id"] = scope.trace_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(level: str, form: str = "text") -> None:
    """Set up the root logger once (``logging.basicConfig``: a handler already there stays)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if form == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
