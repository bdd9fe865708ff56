"""The A2A routes on the one aiohttp server: the JSON-RPC endpoint (with and without a trailing
slash) and the agent card (public: clients read it before they have a key). a2a-sdk is loaded at
the first JSON-RPC call (``endpoint.py``), not when the server starts."""

from __future__ import annotations

import hashlib
import ipaddress
import json

from aiohttp import web

from agentik.core.agent import ChatAgent
from agentik.core.app import error_response
from agentik.core.security import host_name, is_loopback, own_content_type, public
from agentik.core.settings import Settings
from agentik_transport_a2a.card import agent_card, skills_version

#: a card built from AGENTIK_PUBLIC_URL is the same for everyone; one that names the Host a
#: client used is that client's (a shared cache must not hand it to others)
CARD_CACHE = "public, max-age=300"
CARD_CACHE_PRIVATE = "private, max-age=300"


class A2ARoutes:
    def __init__(self, agent: ChatAgent, settings: Settings, root: str) -> None:
        self.agent, self.settings, self.root = agent, settings, root
        self._cards: dict[tuple[str, int | None], tuple[bytes, str]] = {}

    def add_to(self, app: web.Application) -> None:
        app.router.add_post(self.root, self.rpc)
        app.router.add_post(self.root + "/", self.rpc)
        app.router.add_get(self.root + "/.well-known/agent-card.json", self.card)
        app.router.add_get("/.well-known/agent-card.json", self.card)

    # --- the agent card -----------------------------------------------------------------------

    def _may_name(self, host: str | None) -> bool:
        """Whether the card may name ``host`` (a request's): a loopback name, an IP address or
        one of AGENTIK_ALLOWED_HOSTS; any other name is only the client's to claim."""
        if host is None:
            return False
        allowed = self.settings["AGENTIK_ALLOWED_HOSTS"] or ()
        if is_loopback(host) or "*" in allowed or host in {h.lower() for h in allowed}:
            return True
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return False
        return True

    @public
    async def card(self, request: web.Request) -> web.Response:
        cache = CARD_CACHE
        if self.settings["AGENTIK_PUBLIC_URL"] is None:
            cache = CARD_CACHE_PRIVATE
            if not self._may_name(host_name(request.host)):
                return error_response(
                    403,
                    "host_not_allowed",
                    f"the agent card would advertise Host {request.host[:100]!r}: set "
                    "AGENTIK_PUBLIC_URL (or list the name in AGENTIK_ALLOWED_HOSTS)",
                )
        base = f"{request.scheme}://{request.host}"
        key = (base, skills_version(self.settings))
        cached = self._cards.get(key)
        if cached is None:
            if len(self._cards) > 32:  # hosts are the client's to name: keep few
                self._cards.clear()
            card = agent_card(self.settings, base, self.root + "/")
            body = json.dumps(card, ensure_ascii=False, indent=2).encode()
            cached = self._cards[key] = (body, f'"{hashlib.sha256(body).hexdigest()[:32]}"')
        body, etag = cached
        headers = {"Cache-Control": cache, "ETag": etag}
        if etag in request.headers.get("If-None-Match", ""):
            return web.Response(status=304, headers=headers)
        return web.Response(body=body, content_type="application/json", headers=headers)

    @own_content_type
    async def rpc(self, request: web.Request) -> web.StreamResponse:
        try:
            from agentik_transport_a2a.endpoint import handle
        except ImportError as e:  # installed without its extra
            message = f"A2A needs a2a-sdk: pip install 'agentik[a2a]' ({e})"
            error = {"code": -32603, "message": message}
            return web.json_response({"jsonrpc": "2.0", "id": None, "error": error})
        return await handle(request, self.agent)
