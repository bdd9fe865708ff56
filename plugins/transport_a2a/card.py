"""The agent card, in two shapes: the pure A2A 1.0 card (what the 1.0 schema allows, nothing
more), and the card for 0.3 clients: the same with the 0.3 fields (``url``,
``preferredTransport``, ``protocolVersion``, ``security`` and the 0.3 keys of the security
schemes) merged in the way a2a-sdk's own server merges them, so that clients of either version
read it. Which one a request gets is the routes' choice (``A2A-Version``, see docs/a2a.md)."""

from __future__ import annotations

from typing import Any

from agentik.core.settings import Settings

CHAT_SKILL = {"id": "chat", "name": "Chat", "tags": ["chat"]}
VERSION_HEADER = "A2A-Version"  # the request header that names the client's A2A version


def agent_card(
    settings: Settings, base_url: str, rpc_path: str, *, legacy: bool = False
) -> dict[str, Any]:
    """The card for clients that reach this server at ``base_url`` (scheme://host[:port]);
    ``AGENTIK_PUBLIC_URL`` wins over it (a server behind a proxy). ``legacy``: with the 0.3
    fields too."""
    public = settings["AGENTIK_PUBLIC_URL"]
    url = (public.rstrip("/") if public else base_url) + rpc_path
    description = settings["AGENTIK_A2A_DESCRIPTION"]
    card: dict[str, Any] = {
        "name": settings["AGENTIK_A2A_NAME"],
        "description": description,
        "version": settings["AGENTIK_A2A_VERSION"],
        "supportedInterfaces": [
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
        ],
        "capabilities": {"streaming": True, "pushNotifications": False},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": skills(settings) or [{**CHAT_SKILL, "description": description}],
    }
    bearer = bool(settings["AGENTIK_API_KEY"])
    if bearer:
        card["securitySchemes"] = {"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}}
        card["securityRequirements"] = [{"schemes": {"bearer": {"list": []}}}]
    if legacy:
        card.update(url=url, preferredTransport="JSONRPC", protocolVersion="0.3.0")
        if bearer:
            card["securitySchemes"]["bearer"].update(type="http", scheme="Bearer")
            card["security"] = [{"bearer": []}]
    return card


def skills_version(settings: Settings) -> int | None:
    """The skills catalogue's version (the card is rebuilt when it changes), None without."""
    catalogue = _catalogue(settings)
    if catalogue is None:
        return None
    catalogue.current()  # rescans when its AGENTIK_SKILLS_RESCAN interval has passed
    return int(catalogue.version)


def skills(settings: Settings) -> list[dict[str, Any]]:
    """The agent's skills from the skills plugin's catalogue, when that plugin is loaded."""
    catalogue = _catalogue(settings)
    if catalogue is None:
        return []
    return [
        {"id": s.name, "name": s.name, "description": s.description, "tags": ["skill"]}
        for s in catalogue.skills()
    ]


def _catalogue(settings: Settings) -> Any:
    if settings.get("AGENTIK_SKILLS_DIR") is None:  # unset, or the skills plugin is not loaded
        return None
    try:
        import agentik_skills
    except ImportError:
        return None
    return agentik_skills.catalogue(settings)
