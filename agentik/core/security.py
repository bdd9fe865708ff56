"""Who may use the server: API keys, the Host allow-list, cross-origin rules and the bind
address. One middleware guards every route of every transport, plugins' routes included;
``docs/security.md`` gives the threat model.

- **API keys** (``AGENTIK_API_KEY``): every route needs ``Authorization: Bearer <key>``
  (compared in constant time against every key), except those marked :func:`public`
  (``/health``, an A2A agent card). A GET of an event-stream route (marked
  :func:`event_stream`) may give the key as ``?access_token=`` instead, because a browser's
  ``EventSource`` cannot set headers; no other request may.
- **DNS rebinding**: without a key the server answers only requests whose ``Host`` is a
  loopback name (or one of ``AGENTIK_ALLOWED_HOSTS``), so a page whose name was rebound to
  127.0.0.1 gets nothing.
- **Cross-site requests**: a state-changing request from a browser page of another origin is
  refused unless the origin is in ``AGENTIK_CORS_ORIGINS``; bodies must be JSON (a form or a
  ``text/plain`` POST, which browsers send cross-site without asking, gets a 415).
- **Malformed requests**: a ``Host`` that is not a host name or address with an optional port
  (``127.0.0.1:80@evil.com``) gets a 400; a body in a ``Content-Encoding`` the server cannot
  decode gets a 415 instead of being read as it is.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.compression_utils import HAS_BROTLI, HAS_ZSTD

from agentik.core.responses import error_response
from agentik.core.settings import SecretSafeError, Settings, parse_list

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger(__name__)

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CORS_MAX_AGE = "600"
#: a Host header: a name (letters, digits, ``.-_~``) or a bracketed IPv6 address, then a port
HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~-]+)(?::[0-9]{1,5})?")
#: the request body encodings aiohttp decodes here (``br`` and ``zstd`` need their modules)
ENCODINGS = frozenset(
    {
        "",
        "identity",
        "gzip",
        "deflate",
        *(["br"] if HAS_BROTLI else []),
        *(["zstd"] if HAS_ZSTD else []),
    }
)


def public(handler: F) -> F:
    """Mark a route handler as open without an API key (``/health``, an agent card)."""
    handler.agentik_public = True  # type: ignore[attr-defined]
    return handler


def event_stream(handler: F) -> F:
    """Mark a GET route handler that answers with an event stream: it takes the API key as
    ``?access_token=`` too (a browser's ``EventSource`` cannot send headers)."""
    handler.agentik_event_stream = True  # type: ignore[attr-defined]
    return handler


def own_content_type(handler: F) -> F:
    """Mark a route handler that refuses non-JSON bodies itself, in its protocol's own terms
    (A2A's JSON-RPC error -32005), instead of the middleware's 415."""
    handler.agentik_own_content_type = True  # type: ignore[attr-defined]
    return handler


MIN_KEY_LENGTH = 16


def parse_api_keys(raw: str) -> tuple[str, ...]:
    """A comma list of keys, or ``@/path/to/file`` with one key per line (``#`` comments).
    Its errors say why without quoting a key (they are shown although the setting is secret)."""
    if raw.startswith("@"):
        path = Path(raw[1:]).expanduser()
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
            raise SecretSafeError(f"cannot read the key file {path}: {why}") from None
        keys = tuple(
            line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")
        )
        if not keys:
            raise SecretSafeError(f"the key file {path} holds no key (one a line, # comments)")
    else:
        keys = parse_list(raw)
    if not keys:
        raise SecretSafeError("no key given")
    short = [i for i, k in enumerate(keys, 1) if len(k) < MIN_KEY_LENGTH]
    if short:
        which = f"key {short[0]} of {len(keys)}" if len(keys) > 1 else "the key"
        raise SecretSafeError(
            f"{which} is too short: a key must be at least {MIN_KEY_LENGTH} characters"
        )
    return keys


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_host(settings: Mapping[str, Any], override: str | None = None) -> str:
    """The interface to listen on: as set, else loopback without a key and every interface
    with one. Raises ``ValueError`` for a non-loopback address without a key unless
    ``AGENTIK_ALLOW_UNAUTHENTICATED=1``."""
    keys = settings["AGENTIK_API_KEY"]
    host = override or settings["AGENTIK_HOST"] or ("0.0.0.0" if keys else "127.0.0.1")
    if not keys and not is_loopback(host) and not settings["AGENTIK_ALLOW_UNAUTHENTICATED"]:
        raise ValueError(
            f"AGENTIK_HOST={host!r} would expose the agent without a key: set AGENTIK_API_KEY, "
            "or AGENTIK_ALLOW_UNAUTHENTICATED=1 to do it anyway (e.g. behind an authenticating "
            "proxy)"
        )
    return host


def host_name(host_header: str) -> str | None:
    """``Host`` without its port: ``example.com:8080`` → ``example.com``, ``[::1]:80`` → ``::1``;
    None when it is no host at all (``127.0.0.1:80@evil.com``)."""
    if not HOST.fullmatch(host_header):
        return None
    if host_header.startswith("["):
        return host_header[1 : host_header.find("]")].lower()
    return host_header.rsplit(":", 1)[0].lower()


def _origin_of(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


async def answered(response: web.StreamResponse) -> web.StreamResponse:
    """A middleware's own answer, as the awaitable a passing-on middleware returns.

    A middleware that passes a request on returns ``handler(request)`` itself instead of
    awaiting it (a plain ``def``, not ``async def``): one that awaits stays in memory, frame and
    coroutine, as long as the request runs, and an SSE stream runs for hours (B8)."""
    return response


def _refuse(status: int, code: str, message: str) -> web.Response:
    return error_response(status, code, message)


class OncePerInterval:
    """Says whether a key (a refused origin) is due a log line again: once per ``interval``
    seconds each, and at most ``most`` keys per interval (origins are the client's to name:
    neither the log nor this table grows without bound)."""

    def __init__(
        self, interval: float = 60.0, most: int = 100, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval, self.most, self.clock = interval, most, clock
        self.last: dict[str, float] = {}

    def due(self, key: str) -> bool:
        now = self.clock()
        if now - self.last.get(key, -self.interval) < self.interval:
            return False
        if len(self.last) >= self.most:
            self.last = {k: t for k, t in self.last.items() if now - t < self.interval}
            if len(self.last) >= self.most:
                return False
        self.last[key] = now
        return True


def middleware(settings: Settings) -> Callable[..., Any]:
    keys = [k.encode() for k in settings["AGENTIK_API_KEY"] or ()]
    allowed_hosts: frozenset[str] | None
    if settings["AGENTIK_ALLOWED_HOSTS"] is not None:
        names = {h.lower() for h in settings["AGENTIK_ALLOWED_HOSTS"]}
        allowed_hosts = None if "*" in names else frozenset(names | LOOPBACK_NAMES)
    else:  # a rebound page cannot present a key: with one, any name may reach the server
        allowed_hosts = None if keys else LOOPBACK_NAMES
    origins = frozenset(settings["AGENTIK_CORS_ORIGINS"])
    refused_origins = OncePerInterval()

    def authorized(request: web.Request, route: Any) -> bool:
        given = ""
        auth = request.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        elif request.method == "GET" and getattr(route, "agentik_event_stream", False):
            given = request.query.get("access_token", "")
        token = given.encode()
        # every key compared, in constant time: no early exit tells which prefix matched
        return any([hmac.compare_digest(token, key) for key in keys])

    @web.middleware
    def guard(request: web.Request, handler: Any) -> Awaitable[web.StreamResponse]:
        refused = refusal(request)
        return handler(request) if refused is None else answered(refused)  # see passing_on

    def refusal(request: web.Request) -> web.StreamResponse | None:
        # the header, not request.host: that one is cached on the request, by every open stream
        host = request.headers.get("Host") or request.host
        name = host_name(host)
        if name is None:
            return _refuse(400, "bad_host", f"Host {host[:100]!r} is not a host name")
        if allowed_hosts is not None and name not in allowed_hosts:
            return _refuse(
                403,
                "host_not_allowed",
                f"Host {host!r} is not served here (set AGENTIK_ALLOWED_HOSTS)",
            )
        origin = request.headers.get("Origin")
        cross = origin is not None and origin != _origin_of(request)
        if cross and origin in origins:
            if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
                preflight = web.Response(status=204)
                preflight.headers["Access-Control-Allow-Methods"] = "GET, POST, PATCH, DELETE"
                preflight.headers["Access-Control-Allow-Headers"] = (
                    "Authorization, Content-Type, Idempotency-Key, Last-Event-ID"
                )
                preflight.headers["Access-Control-Max-Age"] = CORS_MAX_AGE
                return preflight
        elif origin is not None and cross:
            # the operator learns which page was turned away: a state change is refused here,
            # a read or a preflight gets no CORS headers, so the browser refuses it
            if refused_origins.due(origin):
                log.warning(
                    "refused a browser page at %s (%s %s): it is not in AGENTIK_CORS_ORIGINS "
                    "(logged once a minute per origin)",
                    origin,
                    request.method,
                    request.path,
                )
            if request.method not in SAFE_METHODS:
                return _refuse(
                    403,
                    "cross_origin",
                    f"requests from {origin} are not allowed (AGENTIK_CORS_ORIGINS)",
                )
        route = request.match_info.handler
        encoding = request.headers.get("Content-Encoding")
        if encoding is not None and request.body_exists and encoding.lower() not in ENCODINGS:
            return _refuse(
                415,
                "unsupported_content_encoding",
                f"the body's Content-Encoding must be one of: {', '.join(sorted(ENCODINGS))}",
            )
        if (
            request.method not in SAFE_METHODS
            and request.body_exists
            and not getattr(route, "agentik_own_content_type", False)
            and not (
                request.content_type == "application/json" or request.content_type.endswith("+json")
            )
        ):
            return _refuse(
                415,
                "unsupported_media_type",
                "the body must be JSON (Content-Type: application/json)",
            )
        handler_is_public = getattr(route, "agentik_public", False)
        if keys and not handler_is_public and not authorized(request, route):
            response = _refuse(401, "unauthorized", "a valid API key is required")
            response.headers["WWW-Authenticate"] = 'Bearer realm="agentik"'
            return response
        return None

    return guard


def response_headers(settings: Settings) -> Callable[..., Any]:
    """``on_response_prepare``: CORS headers for allowed origins (SSE streams included, which
    are prepared inside their handler), and no ``Server: Python/… aiohttp/…`` banner."""
    origins = frozenset(settings["AGENTIK_CORS_ORIGINS"])

    async def prepare(request: web.Request, response: web.StreamResponse) -> None:
        response.headers.pop("Server", None)
        origin = request.headers.get("Origin")
        if origin is not None and origin in origins:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Vary"] = "Origin"

    return prepare
