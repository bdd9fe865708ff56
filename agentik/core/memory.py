"""The long-term memory contract. A custom memory backend implements :class:`MemoryBackend`.

The core picks one backend by ``AGENTIK_MEMORY_BACKEND`` (``off``, or ``AGENTIK_MEMORY_DIR=off``,
turns memory off), starts it before requests are served and closes it at shutdown; plugins
reach it as ``agent.memory`` (``None`` when memory is off). Everything built on top of the
store (the ``memory_*`` tools, the prefetch block, the post-turn review, the curator) is the
``memory`` plugin's and works with any backend.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

#: the three kinds of note
CATEGORIES = ("user", "world", "preference")
#: who saved a note: the model when the user asked (``USER``) or on its own (``AGENT``), the
#: post-turn review, or the review of turns about to be compacted
SOURCES = ("USER", "AGENT", "AUTO_REVIEW", "PRE_COMPACTION")


class NoteError(Exception):
    """A request the backend refuses: an unknown category or id, an unwritable file.

    Its message is shown to the model as a tool error, so say what is wrong in a sentence.
    """


@dataclass(frozen=True, slots=True)
class Note:
    """One remembered fact."""

    id: str
    category: str  # one of CATEGORIES
    text: str
    source: str  # one of SOURCES
    created: datetime  # aware, UTC
    last_used: datetime | None = None  # last given to the model by the prefetch
    uses: int = 0  # how many times the prefetch gave it to the model
    #: relevance to the query in [0, 1], set on the notes :meth:`MemoryBackend.search` returns
    score: float | None = field(default=None, compare=False)


def check_category(category: str) -> str:
    if category not in CATEGORIES:
        raise NoteError(f"unknown category {category!r}; use one of {', '.join(CATEGORIES)}")
    return category


def normalise(text: str) -> str:
    """The form two notes are compared in to find a fact saved twice: case, punctuation and
    spacing do not count."""
    return " ".join(re.findall(r"\w+", text.casefold()))


class MemoryBackend(abc.ABC):
    """Where notes live and how they are found. Every method may be called concurrently."""

    async def start(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Open files or connections; called once before the server accepts requests."""

    async def close(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Release them; called once at shutdown."""

    def describe(self) -> str:
        """Where and how much, for the start-up banner (``/path, 12 notes``)."""
        return ""

    @abc.abstractmethod
    async def save(self, category: str, text: str, source: str) -> Note:
        """Store a new note; raise :class:`NoteError` for a category outside
        :data:`CATEGORIES`."""

    @abc.abstractmethod
    async def search(self, query: str, limit: int) -> list[Note]:
        """At most ``limit`` notes relevant to ``query``, best first, each with ``score`` (0-1).

        Return only notes that share something meaningful with the query; the prefetch drops
        the ones below ``AGENTIK_MEMORY_MIN_SCORE``.
        """

    @abc.abstractmethod
    async def get(self, note_id: str) -> Note | None: ...

    @abc.abstractmethod
    async def list(self, category: str, offset: int = 0, limit: int = 50) -> list[Note]:
        """A page of one category's notes, oldest first."""

    @abc.abstractmethod
    async def delete(self, note_id: str, recoverable: bool = True) -> bool:
        """Remove a note (kept somewhere a person can restore it from when ``recoverable``);
        False when there is no such note."""

    @abc.abstractmethod
    async def mark_used(self, note_ids: Sequence[str]) -> None:
        """The prefetch gave these notes to the model: bump ``uses``, set ``last_used``."""

    @abc.abstractmethod
    async def archive_stale(self, max_age: timedelta) -> int:
        """Archive the notes never used (``uses == 0``) and older than ``max_age``; return how
        many were archived (the curator's pass)."""

    @abc.abstractmethod
    async def count(self) -> int:
        """How many notes are live."""


def memory_off(settings: Any) -> bool:
    """``AGENTIK_MEMORY_BACKEND=off`` or ``AGENTIK_MEMORY_DIR=off``."""
    return bool(
        settings["AGENTIK_MEMORY_BACKEND"] == "off" or settings["AGENTIK_MEMORY_DIR"] == "off"
    )


def parse_memory_dir(raw: str) -> str:
    """A folder, or ``off`` (also ``none``, ``0``, ``false``, ``no``): no memory at all."""
    return "off" if raw.strip().lower() in ("off", "none", "0", "false", "no") else raw


__all__ = [
    "CATEGORIES",
    "SOURCES",
    "MemoryBackend",
    "Note",
    "NoteError",
    "check_category",
    "normalise",
]
