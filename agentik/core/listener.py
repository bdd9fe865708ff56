"""The listening socket of ``agentik serve``: a cap on open connections and per-client limits
(:mod:`agentik.core.limits`), a write timeout for clients that stop reading, JSON for the errors
aiohttp answers itself, and one log line per kind of client trouble per interval.

aiohttp answers a request it cannot parse (a bad request line, NUL in a header, an over-long
header, an unknown method) before any handler or middleware runs, with a text/plain body and a
logged traceback. Those are the client's mistakes: here they get the API's JSON error body and
are counted, not logged one by one, so a flood of broken or hostile clients costs one line per
minute instead of thousands.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import gc
import json
import logging
import resource
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from agentik.core.limits import TOO_MANY, ClientLimits, client_key

log = logging.getLogger("agentik.serve")

#: seconds between two log lines about one kind of client trouble
LOG_INTERVAL = 60.0
#: descriptors kept free beyond the connection cap (database, WAL, MCP pipes, log files)
FD_RESERVE = 64
#: the soft descriptor limit aimed at when the hard one is unlimited
MANY_FDS = 1 << 16
#: connections open at once after which their closing gives memory back to the system
TRIM_AFTER = 256
#: connections the kernel queues for ``accept`` (a burst beyond it waits for SYN retries,
#: 1, 3, 7, 15 s; the kernel caps it at net.core.somaxconn)
BACKLOG = 4096
#: connections asyncio accepts in one go (its ``backlog`` argument)
ACCEPT_BATCH = 100
#: seconds between two looks at the connections whose client does not read
SWEEP_INTERVAL = 1.0

#: what each kind of trouble is called in the log
KINDS = {
    "refused": "connections refused: AGENTIK_MAX_CONNECTIONS connections were open",
    "bad_request": "malformed requests answered 400",
    "slow_body": "request bodies that did not arrive within AGENTIK_BODY_TIMEOUT (408)",
    "client_limit": "connections refused (429): their client was over its limits "
    "(AGENTIK_MAX_CLIENT_CONNECTIONS, AGENTIK_CLIENT_CONNECTION_RATE)",
    "write_timeout": "connections dropped: their client read nothing for AGENTIK_WRITE_TIMEOUT",
    "accept_failed": "connections not accepted: the process is out of file descriptors "
    "(accepting again in 1 s)",
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
    malformed request is counted by the :class:`TroubleLog`, not logged with a traceback. A
    client over its limits (:class:`~agentik.core.limits.ClientLimits`) gets a 429 instead, and
    a connection whose writes stall is reported to the :class:`Listener`'s sweep."""

    # as aiohttp's own: an instance dict would cost every open connection (B8)
    __slots__ = ("client", "listener", "trouble")

    def __init__(self, *args: Any, listener: Listener, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.listener = listener
        self.trouble = listener.trouble
        self.client: str | None = None  # counted against its client's limits

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        address = peer[0] if isinstance(peer, tuple) else ""
        limits = self.listener.limits
        if limits is not None and address and not limits.is_trusted(address):
            client = client_key(address)
            if client is not None:
                reason = limits.admit(client, asyncio.get_running_loop().time())
                if reason is not None:  # answered by a Refusal instead; aiohttp never saw it
                    self.trouble.count("client_limit", f"{address}: {reason}")
                    refusal = Refusal(429, TOO_MANY, f"{reason}; retry later")
                    transport.set_protocol(refusal)
                    refusal.connection_made(transport)
                    return
                self.client = client
        super().connection_made(transport)
        self.listener.connection_opened()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.client is not None and self.listener.limits is not None:
            self.listener.limits.release(self.client)
            self.client = None
        self.listener.stalled.pop(self, None)
        super().connection_lost(exc)
        self.listener.connection_closed()

    def pause_writing(self) -> None:
        super().pause_writing()
        self.listener.stalled_writing(self)

    def resume_writing(self) -> None:
        super().resume_writing()
        self.listener.stalled.pop(self, None)

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
    """Answers a connection it may not serve (over the cap: 503; its client over its limits:
    429) and closes it: the client learns why at once, and the descriptor is free again."""

    def __init__(
        self,
        status: int = 503,
        code: str = "too_many_connections",
        message: str = "the server has too many open connections; retry later",
    ) -> None:
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        reason = HTTPStatus(status).phrase
        self.response = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Retry-After: 1\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.response)
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
    connection, a :class:`Refusal` beyond ``max_connections``. It also drops the connections
    whose client has read nothing for ``write_timeout`` seconds while the server had data for
    it (a client that asks for a big page, or follows a stream, and stops reading would hold
    its buffers and its handler forever)."""

    def __init__(
        self,
        server: web.Server,
        max_connections: int,
        trouble: TroubleLog,
        handler_args: dict[str, Any],
        limits: ClientLimits | None = None,
        write_timeout: float = 30.0,
    ) -> None:
        self.server = server
        self.max_connections = max_connections
        self.trouble = trouble
        self.handler_args = handler_args
        self.limits = limits
        self.write_timeout = write_timeout
        #: connections whose writing is paused: (since when no byte left, buffered bytes then)
        self.stalled: dict[JsonErrorHandler, tuple[float, int]] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self.open = 0  # connections served now (aiohttp's own count lags behind their ends)
        #: the most connections open at once since memory was last given back
        self.peak = 0
        self._trim: asyncio.TimerHandle | None = None

    def __call__(self) -> asyncio.Protocol:
        if len(self.server.connections) >= self.max_connections:
            self.trouble.count("refused")
            return Refusal()
        return JsonErrorHandler(
            self.server,
            loop=asyncio.get_running_loop(),
            listener=self,
            **self.handler_args,
        )

    def connection_opened(self) -> None:
        self.open += 1
        self.peak = max(self.peak, self.open)

    def connection_closed(self) -> None:
        """Once most of many connections closed, give their memory back to the system (a
        moment later, when the rest of a burst has closed too)."""
        self.open -= 1
        if self._trim is None and self.peak >= TRIM_AFTER and self.open <= self.peak // 2:
            self._trim = asyncio.get_running_loop().call_later(1.0, self._give_back)

    def _give_back(self) -> None:
        self._trim = None
        self.peak = self.open
        give_back_memory()

    def stalled_writing(self, conn: JsonErrorHandler) -> None:
        loop = asyncio.get_running_loop()
        self.stalled[conn] = (loop.time(), _buffered(conn))
        if self._sweep is None:
            self._sweep = loop.call_later(SWEEP_INTERVAL, self._drop_stalled)

    def _drop_stalled(self) -> None:
        """Abort the paused connections that made no progress for ``write_timeout``: their
        buffers go, and their handlers end (a write waiting for them fails)."""
        self._sweep = None
        now = asyncio.get_running_loop().time()
        for conn, (since, size) in list(self.stalled.items()):
            left = _buffered(conn)
            if left < size:  # the client read some: it is slow, not gone
                self.stalled[conn] = (now, left)
            elif now - since >= self.write_timeout:
                self.stalled.pop(conn, None)
                self.trouble.count("write_timeout", str(_peer(conn)))
                abort(conn)
        if self.stalled:
            self._sweep = asyncio.get_running_loop().call_later(SWEEP_INTERVAL, self._drop_stalled)

    def close(self) -> None:
        for timer in (self._sweep, self._trim):
            if timer is not None:
                timer.cancel()
        self._sweep = self._trim = None


def give_back_memory() -> None:
    """Free what closed connections left and give the pages back to the system. A connection
    is a web of objects referring to each other (transport, protocol, request, handler task):
    only the garbage collector's full pass frees those that lived long enough to reach its
    oldest generation, which it runs rarely; and the C allocator keeps freed pages for later
    (glibc's ``malloc_trim`` returns them). Without both a server's RSS stays at its peak after
    a burst of streams (B8)."""
    gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


@functools.cache
def _glibc() -> Any:
    """glibc through ctypes, loaded at the first trim (``ctypes`` is 0.4 MiB of a bare
    server's RSS, and most never trim)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to give back this way
        return None


def _buffered(conn: RequestHandler) -> int:
    transport = conn.transport
    return transport.get_write_buffer_size() if transport is not None else 0


def _peer(conn: RequestHandler) -> Any:
    transport = conn.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    return peer[0] if isinstance(peer, tuple) else peer


def abort(conn: RequestHandler) -> None:
    """Close a connection at once, whatever it still had to send or receive."""
    transport = conn.transport
    if transport is not None:
        transport.abort()


def quiet_accept_errors(
    trouble: TroubleLog,
) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """An event-loop exception handler: asyncio reports every ``accept`` that fails for want
    of descriptors with a traceback (and tries again in a second); these are counted instead,
    one line a minute. Everything else goes to the default handler."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        if isinstance(error, OSError) and error.errno in (
            errno.EMFILE,
            errno.ENFILE,
            errno.ENOBUFS,
            errno.ENOMEM,
        ):
            trouble.count("accept_failed", str(error))
            return
        loop.default_exception_handler(context)

    return handle


def connection_cap(wanted: int, warn: Callable[[str], None] = log.warning) -> int:
    """``wanted`` connections need as many descriptors and a reserve: raise the process's soft
    limit to its hard limit (a burst beyond the cap needs descriptors too, for the moment its
    connections are refused), or lower the cap to what the limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + FD_RESERVE
    unlimited = hard == resource.RLIM_INFINITY  # the kernel still has its own ceiling
    for target in (max(need, MANY_FDS), need) if unlimited else (hard,):
        if soft == resource.RLIM_INFINITY or soft >= target:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            continue
        soft = target
        break
    if soft != resource.RLIM_INFINITY and soft < need:
        cap = max(1, soft - FD_RESERVE)
        warn(
            f"AGENTIK_MAX_CONNECTIONS={wanted} needs {need} file descriptors but this process "
            f"may open {soft} (ulimit -n): at most {cap} connections are served"
        )
        return cap
    return wanted
