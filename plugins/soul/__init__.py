"""Persona (F8): ``AGENTIK_SOUL``, a markdown file put at the very top of the system prompt,
above the base prompt, skills, memory and reflections.

The file must be readable at start-up (else start-up stops naming the variable). Its text is
read again whenever it changes on disk (one ``stat`` per system prompt rendered, i.e. per turn:
an edit reaches every conversation at its next turn); if it becomes unreadable later, the last
text read stays and a warning is logged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentik.core import settings as cfg
from agentik.core.settings import Setting, Settings
from agentik.hookspecs import hookimpl
from agentik_soul.soul import SoulFile, read_soul

PROMPT_ORDER = 0  # the very top: persona 0, base prompt 100, skills 200, memory 300, …


def parse_soul(raw: str) -> Path:
    """The persona file, which must exist and be readable UTF-8 text now."""
    path = cfg.parse_path(raw)
    read_soul(path)  # ValueError: start-up stops with `AGENTIK_SOUL=… is invalid: …`
    return path


SETTINGS = (
    Setting(
        "AGENTIK_SOUL",
        None,
        parse_soul,
        "Markdown file with the agent's persona (voice, character, limits), put at the very top "
        "of the system prompt; edits are picked up without a restart.",
    ),
)


def soul(settings: Settings) -> SoulFile | None:
    path = settings.get("AGENTIK_SOUL")
    return None if path is None else SoulFile.of(path)


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    for setting in SETTINGS:
        register(setting)


@hookimpl
def register_prompt_sections(register: Callable[..., None], settings: Settings) -> None:
    found = soul(settings)
    if found is not None:
        register("soul", found.render, order=PROMPT_ORDER)


@hookimpl
def banner_lines(settings: Settings) -> list[str] | None:
    found = soul(settings)
    return None if found is None else [f"soul: {found.path} ({len(found.text())} chars)"]


@hookimpl
def plugin_details(settings: Settings) -> dict[str, Any] | None:
    found = soul(settings)
    return None if found is None else {"path": str(found.path), "chars": len(found.text())}
