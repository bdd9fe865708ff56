"""``AGENTIK_TOOL_APPROVAL``, parsed: which tool calls wait for a person's approval."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from agentik.core.tools import Tool

#: a tool name or a glob of them (letters, digits, _ and -, with * ? [ ])
PATTERN = re.compile(r"^[a-zA-Z0-9_\-*?\[\]]{1,64}$")


@dataclass(frozen=True, slots=True)
class Policy:
    everything: bool = False
    destructive: bool = False
    patterns: tuple[str, ...] = ()

    def holds(self, name: str, tool: Tool | None) -> bool:
        """Whether a call of the tool ``name`` waits for approval."""
        if tool is not None and tool.requires_approval:
            return True
        if self.everything:
            return True
        if self.destructive and tool is not None and tool.destructive:
            return True
        return any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    def __str__(self) -> str:
        if self.everything:
            return "all"
        words = ["destructive"] if self.destructive else []
        return ",".join([*words, *self.patterns]) or "off"

    def describe(self) -> str:
        """What waits, in words (the banner)."""
        if self.everything:
            return "every tool call waits for a person's approval"
        what = [*(["destructive tools"] if self.destructive else []), *self.patterns]
        always = "tools made with requires_approval"
        if not what:
            return f"off ({always} still wait)"
        return f"{', '.join(what)} and {always} wait for a person's approval"


def parse_policy(raw: str) -> Policy:
    words = [w.strip() for w in raw.split(",") if w.strip()]
    if not words or words == ["off"]:
        return Policy()
    if words == ["all"]:
        return Policy(everything=True)
    if "all" in words or "off" in words:
        raise ValueError("'all' and 'off' stand alone")
    bad = [w for w in words if w != "destructive" and not PATTERN.match(w)]
    if bad:
        raise ValueError(f"{bad[0]!r} is not a tool name or glob (letters, digits, _ - * ? [ ])")
    patterns = tuple(w for w in words if w != "destructive")
    return Policy(destructive="destructive" in words, patterns=patterns)
