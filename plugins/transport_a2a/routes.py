"""The A2A routes on the one aiohttp server: the JSON-RPC endpoint (with and without a trailing
slash) and the agent card (public: clients read it before they have a key). a2a-sdk is loaded at
the first JSON-RPC call (``endpoint.py``), not when the server starts."""

from __future__ import annotations

import hashlib
import ipaddress
import json
from datetime import UTC, datetime

from aiohttp import web

from agentik.core.agent import ChatAgent
from agentik.core.app import error_response
from agentik.core.security import host_name, is_loopback, own_content_type, public
from agentik.core.settings import Settings
from agentik_transport_a2a.card import VERSION_HEADER, agent_card, skills_version

#: a card built from AGENTIK_PUBLIC_URL is the same for everyone; one that names the Host a
#: client used is that client's (a shared cache must not hand it to others)
CARD_CACHE = "public, max-age=300"
CARD_CACHE_PRIVATE = "private, max-age=300"


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)  # HTTP dates have whole seconds


class A2ARoutes:
    def __init__(self, agent: ChatAgent, settings: Settings, root: str) -> None:
        self.agent, self.settings, self.root = agent, settings, root
        self._cards: dict[tuple[bool, str, int | None], tuple[bytes, str]] = {}
        # the card changes only with the skills catalogue: since when it is as it is
        self._changed: tuple[int | None, datetime] = (None, _now())

    def add_to(self, app: web.Application) -> None:
        app.router.add_post(self.root, self.rpc)
        app.router.add_post(self.root + "/", self.rpc)
        app.router.add_get(self.root + "/.well-known/agent-card.json", self.card)
        app.router.add_get("/.well-known/agent-card.json", self.card)

    # --- the agent card -----------------------------------------------------------------------

    def legacy_card(self, request: web.Request) -> bool:
        """Whether to answer with the card 0.3 clients read: ``A2A-Version`` 0.x says so, 1.x
        says not; without the header, the seeds' 0.3 path under the A2A root gets it and the
        1.0 discovery path at the host's root does not."""
        asked = request.headers.get(VERSION_HEADER, "").strip()
        if asked:
            return asked.split(".", 1)[0] == "0"
        return request.path != "/.well-known/agent-card.json"

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
        legacy = self.legacy_card(request)
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
        version = skills_version(self.settings)
        if version != self._changed[0]:
            self._changed = (version, _now())
        key = (legacy, base, version)
        cached = self._cards.get(key)
        if cached is None:
            if len(self._cards) > 32:  # hosts are the client's to name: keep few
                self._cards.clear()
            card = agent_card(self.settings, base, self.root + "/", legacy=legacy)
            body = json.dumps(card, ensure_ascii=False, indent=2).encode()
            cached = self._cards[key] = (body, f'"{hashlib.sha256(body).hexdigest()[:32]}"')
        body, etag = cached
        modified = self._changed[1]
        headers = {"Cache-Control": cache, "ETag": etag, "Vary": VERSION_HEADER}
        if request.headers.get("If-None-Match") is not None:  # it wins over If-Modified-Since
            fresh = etag in request.headers["If-None-Match"]
        else:
            since = request.if_modified_since
            fresh = since is not None and since >= modified
        response = web.Response(status=304, headers=headers)
        if not fresh:
            response = web.Response(body=body, content_type="application/json", headers=headers)
        response.last_modified = modified
        return response

    @own_content_type
    async def rpc(self, request: web.Request) -> web.StreamResponse:
        try:
            from agentik_transport_a2a.endpoint import handle
        except ImportError as e:  # installed without its extra
            message = f"A2A needs a2a-sdk: pip install 'agentik-runtime[a2a]' ({e})"
            error = {"code": -32603, "message": message}
            return web.json_response({"jsonrpc": "2.0", "id": None, "error": error})
        return await handle(request, self.agent)
