"""The listening socket of ``agentik serve``: a cap on open connections, JSON for the errors
aiohttp answers itself, and one log line per kind of client trouble per interval.

aiohttp answers a request it cannot parse (a bad request line, NUL in a header, an over-long
header, an unknown method) before any handler or middleware runs, with a text/plain body and a
logged traceback. Those are the client's mistakes: here they get the API's JSON error body and
are counted, not logged one by one, so a flood of broken or hostile clients costs one line per
minute instead of thousands.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger("agentik.serve")

#: seconds between two log lines about one kind of client trouble
LOG_INTERVAL = 60.0
#: descriptors kept free beyond the connection cap (database, WAL, MCP pipes, log files)
FD_RESERVE = 64

#: what each kind of trouble is called in the log
KINDS = {
    "refused": "connections refused: AGENTIK_MAX_CONNECTIONS connections were open",
    "bad_request": "malformed requests answered 400",
    "slow_body": "request bodies that did not arrive within AGENTIK_BODY_TIMEOUT (408)",
}


class TroubleLog:
    """Logs the first event of a kind at once, then counts the rest and logs their number once
    per ``interval``: the operator learns that it happens without a line per connection."""

    def __init__(self, interval: float = LOG_INTERVAL) -> None:
        self.interval = interval
        self.counts: dict[str, int] = {}  # since the last line, per kind
        self.totals: dict[str, int] = {}  # since start (tests, /debug)
        self._flush: dict[str, asyncio.TimerHandle] = {}

    def count(self, kind: str, detail: str = "", exc_info: BaseException | None = None) -> None:
        """One more event of ``kind``; the first of an interval is logged with ``detail`` (and
        the traceback of ``exc_info``), the rest are counted."""
        self.totals[kind] = self.totals.get(kind, 0) + 1
        if kind in self._flush:  # a line was written this interval: count it for the next
            self.counts[kind] = self.counts.get(kind, 0) + 1
            return
        log.warning(
            "%s%s (more in the next %g s are counted, not logged)",
            KINDS.get(kind, kind),
            f": {detail}" if detail else "",
            self.interval,
            exc_info=exc_info,
        )
        self._schedule(kind)

    def _schedule(self, kind: str) -> None:
        loop = asyncio.get_running_loop()
        self._flush[kind] = loop.call_later(self.interval, self._report, kind)

    def _report(self, kind: str) -> None:
        del self._flush[kind]
        n = self.counts.pop(kind, 0)
        if n:
            log.warning("%d more %s in the last %g s", n, KINDS.get(kind, kind), self.interval)
            self._schedule(kind)  # still happening: keep counting

    def close(self) -> None:
        for handle in self._flush.values():
            handle.cancel()
        self._flush.clear()


def error_code(status: int) -> str:
    """``bad_request`` for 400, ``request_header_fields_too_large`` for 431…"""
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return "error"


class _BareResponse(web.Response):
    """A response without aiohttp's ``Server: Python/… aiohttp/…`` header; the app's
    ``on_response_prepare`` removes it from every other response, but aiohttp's own error
    answers never reach the app."""

    async def _prepare_headers(self) -> None:
        await super()._prepare_headers()
        self.headers.pop("Server", None)


class JsonErrorHandler(RequestHandler):
    """aiohttp's connection handler, but the errors it answers itself are JSON and a client's
    malformed request is counted by the :class:`TroubleLog`, not logged with a traceback."""

    def __init__(self, *args: Any, trouble: TroubleLog, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trouble = trouble

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            self.log_exception("Error handling request from %s", request.remote, exc_info=exc)
            text = "internal server error"
        else:
            # the parser's message: what is wrong, then the offending bytes and a caret
            lines = (message or HTTPStatus(status).phrase).strip().splitlines()
            text = " ".join(line.strip() for line in lines if line.strip("^ "))[:200]
            self.trouble.count("bad_request", f"{request.remote}: {text}")
        if request.writer.output_size > 0:  # as aiohttp: the response already began
            raise ConnectionError("Response is sent already, cannot send the error")
        body = {"error": {"code": error_code(status), "message": text}}
        response = _BareResponse(
            text=json.dumps(body), status=status, content_type="application/json"
        )
        response.force_close()
        return response


class Refusal(asyncio.Protocol):
    """Answers a connection over the cap with a 503 and closes it: the client learns why at
    once, and the descriptor is free again."""

    BODY = (
        b'{"error": {"code": "too_many_connections", "message": '
        b'"the server has too many open connections; retry later"}}'
    )
    RESPONSE = (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
    )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.RESPONSE)
        # closed once the request arrived (closing with it unread would reset the
        # connection before the client read the answer), or after a second at most
        self.timer = asyncio.get_running_loop().call_later(1.0, transport.abort)

    def data_received(self, data: bytes) -> None:
        self.timer.cancel()
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.timer.cancel()


class Listener:
    """The protocol factory of the listening socket: one :class:`JsonErrorHandler` per
    connection, a :class:`Refusal` beyond ``max_connections``."""

    def __init__(
        self,
        server: web.Server,
        max_connections: int,
        trouble: TroubleLog,
        handler_args: dict[str, Any],
    ) -> None:
        self.server = server
        self.max_connections = max_connections
        self.trouble = trouble
        self.handler_args = handler_args

    def __call__(self) -> asyncio.Protocol:
        if len(self.server.connections) >= self.max_connections:
            self.trouble.count("refused")
            return Refusal()
        return JsonErrorHandler(
            self.server,
            loop=asyncio.get_running_loop(),
            trouble=self.trouble,
            **self.handler_args,
        )


def connection_cap(wanted: int, warn: Callable[[str], None] = log.warning) -> int:
    """``wanted`` connections need as many descriptors and a reserve: raise the process's soft
    limit towards its hard limit for them, or lower the cap to what the limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < need:
        cap = max(1, soft - FD_RESERVE)
        warn(
            f"AGENTIK_MAX_CONNECTIONS={wanted} needs {need} file descriptors but this process "
            f"may open {soft} (ulimit -n): at most {cap} connections are served"
        )
        return cap
    return wanted
