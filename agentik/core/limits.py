"""Per-client limits: one client cannot take the connections every client shares.

A client is an IP address (an IPv6 client is its /64, what one host is usually given). It may
hold ``AGENTIK_MAX_CLIENT_CONNECTIONS`` connections at once and open
``AGENTIK_CLIENT_CONNECTION_RATE`` new ones a second (a burst of as many again); beyond that a
connection is answered ``429`` and closed (:mod:`agentik.core.listener` counts and refuses).

A reverse proxy is many clients on few connections: a connection from one of
``AGENTIK_TRUSTED_PROXIES`` (default: loopback, where a proxy on the same host connects from) is
not limited per address; its requests are, by the client it names in ``X-Forwarded-For`` (the
last address there that is not a trusted proxy itself, so a client cannot pick its own), to as
many requests at once (SSE streams included) as a direct client may hold connections. A
request from a trusted proxy without ``X-Forwarded-For`` (a local client) is not limited.
``X-Forwarded-For`` from any other address is ignored.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from agentik.core.security import answered
from agentik.core.streaming import LateStream

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: the loopback proxies trusted by default
LOOPBACK_PROXIES = ("127.0.0.1", "::1")
#: refused requests' answer, as a connection over the limits gets it
TOO_MANY = "too_many_client_connections"


def parse_trusted_proxies(raw: str) -> tuple[Network, ...]:
    """A comma list of addresses or networks (``10.0.0.0/8``); ``none`` trusts no proxy."""
    items = [x.strip() for x in raw.split(",") if x.strip()]
    if [x.lower() for x in items] == ["none"]:
        return ()
    try:
        return tuple(ipaddress.ip_network(x, strict=False) for x in items)
    except ValueError as e:
        raise ValueError(f"must be IP addresses or networks (or none): {e}") from None


def client_key(address: str) -> str | None:
    """The client an address is: itself (IPv4), its /64 (IPv6); None when it is no IP address
    (a Unix socket)."""
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class ClientLimits:
    """Open connections and new connections a second, per client; and who is a proxy."""

    def __init__(
        self, max_connections: int, rate: float, trusted: tuple[Network, ...] = ()
    ) -> None:
        self.max_connections = max_connections
        self.rate = rate
        self.burst = 2 * rate  # new connections a client may open at once
        self.trusted = trusted
        self._open: dict[str, int] = {}
        self._tokens: dict[str, tuple[float, float]] = {}  # client -> (tokens, at loop time)

    def is_trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.partition("%")[0])
        except ValueError:
            return False
        return any(ip in net for net in self.trusted)

    def admit(self, client: str, now: float, *, rate: bool = True) -> str | None:
        """Count one more connection (or request) of ``client``; None when it may have it, else
        why not (it is then not counted)."""
        if self._open.get(client, 0) >= self.max_connections:
            return f"a client may hold {self.max_connections} connections at once"
        if rate:
            tokens, then = self._tokens.get(client, (self.burst, now))
            tokens = min(self.burst, tokens + (now - then) * self.rate)
            if tokens < 1:
                self._tokens[client] = (tokens, now)
                return f"a client may open {self.rate:g} connections a second"
            self._tokens[client] = (tokens - 1, now)
            if len(self._tokens) > 4 * self.max_connections + 1024:
                self._forget_idle(now)
        self._open[client] = self._open.get(client, 0) + 1
        return None

    def release(self, client: str) -> None:
        left = self._open.get(client, 0) - 1
        if left > 0:
            self._open[client] = left
        else:
            self._open.pop(client, None)

    def _forget_idle(self, now: float) -> None:
        """Drop the buckets that have refilled: the clients that stopped connecting."""
        full = self.burst / self.rate
        self._tokens = {c: v for c, v in self._tokens.items() if now - v[1] < full}

    def forwarded_client(self, request: web.BaseRequest) -> str | None:
        """The client a trusted proxy's request comes from: the last ``X-Forwarded-For``
        address that is not a trusted proxy; None without the header (or from any other peer,
        whose header means nothing)."""
        if request.remote is None or not self.is_trusted(request.remote):
            return None
        hops = [
            h.strip() for h in ",".join(request.headers.getall("X-Forwarded-For", ())).split(",")
        ]
        for hop in reversed([h for h in hops if h]):
            if not self.is_trusted(hop):
                return client_key(hop)
        return None

    def middleware(self, refuse: Callable[[str], web.StreamResponse]) -> Any:
        """Limits the requests of the clients behind a trusted proxy (``refuse(reason)``
        answers one over its limit)."""

        @web.middleware
        def per_forwarded_client(
            request: web.Request, handler: Any
        ) -> Awaitable[web.StreamResponse]:
            client = self.forwarded_client(request)
            if client is None:  # passed on, not awaited (security.answered says why)
                return handler(request)  # type: ignore[no-any-return]
            reason = self.admit(client, 0.0, rate=False)
            if reason is not None:
                return answered(refuse(reason))
            return self._counted(client, handler(request))

        return per_forwarded_client

    async def _counted(
        self, client: str, answer: Awaitable[web.StreamResponse]
    ) -> web.StreamResponse:
        """Counted until the answer is written: for a stream, until it ends."""
        try:
            response = await answer
        except BaseException:
            self.release(client)
            raise
        if isinstance(response, LateStream):
            response.when_done(lambda: self.release(client))
        else:
            self.release(client)
        return response
