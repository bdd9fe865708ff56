"""Tool names the model can call: ``server__tool``, valid and unique.

The OpenAI API (and agentik's registry) accept ``^[a-zA-Z0-9_-]{1,64}$``. Anything else becomes
``_``; a name over 64 characters keeps its start and gets a short hash of the full name; a name
already taken (by an in-agent tool or an earlier MCP tool) gets ``_2``, ``_3``…
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection

MAX = 64
_INVALID = re.compile(r"[^a-zA-Z0-9_-]")


def valid(name: str) -> str:
    """``name`` with every character the API does not accept replaced by ``_``."""
    return _INVALID.sub("_", name)


def exposed_name(server: str, tool: str, taken: Collection[str]) -> str:
    name = valid(f"{server}__{tool}")
    if len(name) > MAX:
        digest = hashlib.sha1(f"{server}\0{tool}".encode()).hexdigest()[:8]
        name = f"{name[: MAX - 9]}_{digest}"
    unique, n = name, 2
    while unique in taken:
        suffix = f"_{n}"
        unique, n = name[: MAX - len(suffix)] + suffix, n + 1
    return unique
