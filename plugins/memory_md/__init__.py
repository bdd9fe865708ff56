"""The ``md`` long-term memory backend (the default): Hermes-style ``user.md``, ``world.md``
and ``preference.md`` in ``AGENTIK_MEMORY_DIR``, searched through an SQLite FTS5 index kept
beside them. See ``docs/memory.md``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentik.core.memory import CATEGORIES, memory_off
from agentik.core.registry import Register
from agentik.core.settings import Settings
from agentik.hookspecs import hookimpl


def memory_folder(settings: Settings) -> Path:
    return Path(settings["AGENTIK_MEMORY_DIR"]).expanduser()


def make_backend(settings: Settings) -> Any:
    from agentik_memory_md.backend import MdMemory

    return MdMemory(memory_folder(settings))


@hookimpl
def register_memory_backends(register: Register) -> None:
    register("md", make_backend)


def selected(settings: Settings) -> bool:
    return not memory_off(settings) and settings["AGENTIK_MEMORY_BACKEND"] == "md"


@hookimpl
def plugin_details(settings: Settings) -> dict[str, Any] | None:
    """For ``agentik plugins``: the folder, the notes per file and the bad parts (read only)."""
    if not selected(settings):
        return None
    from datetime import UTC, datetime

    from agentik_memory_md import notefile
    from agentik_memory_md.backend import read_text

    folder = memory_folder(settings)
    notes: dict[str, int] = {}
    problems: list[str] = []
    for category in CATEGORIES:
        path = folder / f"{category}.md"
        if path.is_file():
            parsed = notefile.parse(read_text(path), category, datetime.now(UTC), path.name)
            notes[path.name] = sum(1 for c in parsed.chunks if c.note is not None)
            problems += parsed.problems
    return {
        "dir": str(folder) if folder.is_dir() else f"{folder} (created at the first start)",
        "notes": notes,
        "bad parts": problems,
    }
