"""The agent card: A2A 1.0 fields, plus the 0.3 ones (``url``, ``preferredTransport``,
``protocolVersion``, ``security``) merged in the way a2a-sdk's own server merges them, so
clients of either version read it."""

from __future__ import annotations

from typing import Any

from agentik.core.settings import Settings

CHAT_SKILL = {"id": "chat", "name": "Chat", "tags": ["chat"]}


def agent_card(settings: Settings, base_url: str, rpc_path: str) -> dict[str, Any]:
    """The card for clients that reach this server at ``base_url`` (scheme://host[:port]);
    ``AGENTIK_PUBLIC_URL`` wins over it (a server behind a proxy)."""
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
        # A2A 0.3
        "url": url,
        "preferredTransport": "JSONRPC",
        "protocolVersion": "0.3.0",
    }
    if settings["AGENTIK_API_KEY"]:
        card["securitySchemes"] = {
            "bearer": {
                "httpAuthSecurityScheme": {"scheme": "Bearer"},
                "type": "http",  # 0.3
                "scheme": "Bearer",  # 0.3
            }
        }
        card["securityRequirements"] = [{"schemes": {"bearer": {"list": []}}}]
        card["security"] = [{"bearer": []}]  # 0.3
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
