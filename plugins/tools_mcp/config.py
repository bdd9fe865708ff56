"""Reading ``mcp.json``: the Claude-Desktop format, ``type``, and ``${VAR}`` expansion.

Pure Python (no ``mcp`` import), so a broken file is reported before anything is started::

    {"mcpServers": {
        "time":   {"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}},
        "remote": {"type": "http", "url": "https://example.com/mcp",
                   "headers": {"Authorization": "Bearer ${API_TOKEN}"}}}}

An entry that is malformed (or names a variable that is not set) becomes a
:class:`ConfigError` for that server alone; the others still start.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: the transports of ``type`` and the spellings other clients write for them
TYPES = {
    "stdio": "stdio",
    "http": "http",
    "streamable-http": "http",
    "streamable_http": "http",
    "streamablehttp": "http",
    "sse": "sse",
}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(ValueError):
    """A config file or entry that cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One entry of ``mcpServers``, variables expanded."""

    name: str
    type: str  # stdio | http | sse
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """``stdio: uvx mcp-server-time`` or ``http: https://…`` (no env, no headers)."""
        if self.type == "stdio":
            return f"stdio: {' '.join([self.command, *self.args])}"
        return f"{self.type}: {self.url}"


def expand(value: str, env: Mapping[str, str]) -> str:
    """Expand ``${VAR}`` and ``${VAR:-default}`` (the default when VAR is unset or empty)."""

    def one(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        got = env.get(name)
        if got:
            return got
        if default is not None:
            return default
        if got is None:
            raise ConfigError(f"${{{name}}} is not set")
        return got

    return _VAR.sub(one, value)


def load(path: Path, env: Mapping[str, str]) -> tuple[list[ServerConfig], dict[str, str]]:
    """Read the file: ``(servers, {name: why it is skipped})``.

    A file that cannot be read or is not ``{"mcpServers": {...}}`` raises :class:`ConfigError`.
    Entries with ``"disabled": true`` are left out silently.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from e
    except ValueError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from e
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise ConfigError(f'{path} has no "mcpServers" object')
    good: list[ServerConfig] = []
    bad: dict[str, str] = {}
    for name, entry in servers.items():
        if isinstance(entry, dict) and entry.get("disabled") is True:
            continue
        try:
            good.append(parse_entry(name, entry, env))
        except ConfigError as e:
            bad[name] = str(e)
    return good, bad


def parse_entry(name: str, entry: Any, env: Mapping[str, str]) -> ServerConfig:
    if not name.strip():
        raise ConfigError("the server name is empty")
    if not isinstance(entry, dict):
        raise ConfigError("the entry is not an object")
    kind = entry.get("type")
    if kind is None:
        kind = "stdio" if "command" in entry else "http" if "url" in entry else None
        if kind is None:
            raise ConfigError('the entry has neither "command" (stdio) nor "url" (http)')
    elif not isinstance(kind, str) or kind.lower() not in TYPES:
        raise ConfigError(f'"type" must be stdio, http or sse, not {kind!r}')
    kind = TYPES[kind.lower()]
    if kind == "stdio":
        command = _string(entry, "command", env)
        if not command:
            raise ConfigError('"command" must be a non-empty string')
        args = entry.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str | int | float) for a in args):
            raise ConfigError('"args" must be a list of strings')
        cwd = _string(entry, "cwd", env) or None
        return ServerConfig(
            name,
            kind,
            command=command,
            args=tuple(expand(str(a), env) for a in args),
            env=_strings(entry, "env", env),
            cwd=cwd,
        )
    url = _string(entry, "url", env)
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f'"url" must be an http:// or https:// URL, not {url!r}')
    return ServerConfig(name, kind, url=url, headers=_strings(entry, "headers", env))


def _string(entry: dict[str, Any], key: str, env: Mapping[str, str]) -> str:
    value = entry.get(key, "")
    if not isinstance(value, str):
        raise ConfigError(f'"{key}" must be a string')
    return expand(value, env)


def _strings(entry: dict[str, Any], key: str, env: Mapping[str, str]) -> dict[str, str]:
    """An object of strings (numbers and booleans are written as JSON writes them)."""
    value = entry.get(key, {})
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f'"{key}" must be an object of strings')
    out: dict[str, str] = {}
    for k, v in value.items():
        if isinstance(v, bool):
            v = "true" if v else "false"
        elif isinstance(v, int | float):
            v = str(v)
        elif not isinstance(v, str):
            raise ConfigError(f'"{key}.{k}" must be a string')
        out[str(k)] = expand(v, env)
    return out
