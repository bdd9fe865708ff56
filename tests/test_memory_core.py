"""The memory contract in the core: AGENTIK_MEMORY_BACKEND chooses a registered backend (or
none), the core starts and closes it, and plugins reach it as ``agent.memory``."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

import agentik_memory_md
from agentik.core.app import AGENT, StartupError
from agentik.core.memory import MemoryBackend, Note, NoteError, check_category, normalise
from agentik.core.testing import make_app
from agentik.hookspecs import hookimpl


class DictMemory(MemoryBackend):
    """A third-party memory backend in one short class: notes in a dict, word-overlap search."""

    def __init__(self) -> None:
        self.notes: dict[str, Note] = {}
        self.ids = itertools.count(1)
        self.events: list[str] = []

    async def start(self) -> None:
        self.events.append("start")

    async def close(self) -> None:
        self.events.append("close")

    def describe(self) -> str:
        return f"a dict, {len(self.notes)} notes"

    async def save(self, category: str, text: str, source: str) -> Note:
        note = Note(f"d{next(self.ids)}", check_category(category), text, source, now())
        self.notes[note.id] = note
        return note

    async def search(self, query: str, limit: int) -> list[Note]:
        words = {w for w in normalise(query).split() if len(w) > 3}
        scored = []
        for note in self.notes.values():
            shared = words & set(normalise(note.text).split())
            if shared:
                scored.append(Note(**{**vars_of(note), "score": len(shared) / len(words)}))
        return sorted(scored, key=lambda n: -(n.score or 0))[:limit]

    async def get(self, note_id: str) -> Note | None:
        return self.notes.get(note_id)

    async def list(self, category: str, offset: int = 0, limit: int = 50) -> list[Note]:
        check_category(category)
        return [n for n in self.notes.values() if n.category == category][offset : offset + limit]

    async def delete(self, note_id: str, recoverable: bool = True) -> bool:
        return self.notes.pop(note_id, None) is not None

    async def mark_used(self, note_ids: Sequence[str]) -> None:
        for i in note_ids:
            n = self.notes[i]
            self.notes[i] = Note(**{**vars_of(n), "uses": n.uses + 1, "last_used": now()})

    async def archive_stale(self, max_age: timedelta) -> int:
        stale = [n.id for n in self.notes.values() if n.uses == 0 and n.created <= now() - max_age]
        for i in stale:
            del self.notes[i]
        return len(stale)

    async def count(self) -> int:
        return len(self.notes)


def now() -> datetime:
    return datetime.now(UTC)


def vars_of(note: Note) -> dict[str, Any]:
    return {f: getattr(note, f) for f in Note.__dataclass_fields__}


class DictPlugin:
    """The test plugin: registers ``dict``; the instance it made is kept for the test."""

    def __init__(self, fail_start: bool = False) -> None:
        self.made: list[DictMemory] = []
        self.fail_start = fail_start

    @hookimpl
    def register_memory_backends(self, register: Any) -> None:
        register("dict", self.make, aliases=("dictionary",))

    def make(self, settings: Any) -> DictMemory:
        backend = DictMemory()
        if self.fail_start:

            async def broken() -> None:
                raise OSError("no room")

            backend.start = broken  # type: ignore[method-assign]
        self.made.append(backend)
        return backend


def app_with(env: dict[str, str], plugin: DictPlugin | None = None) -> Any:
    plugins = [("agentik_memory_md", agentik_memory_md), ("dictmem", plugin or DictPlugin())]
    return make_app(plugins=plugins, env=env)


def test_an_unknown_backend_stops_start_up_listing_the_names():
    with pytest.raises(StartupError) as e:
        app_with({"AGENTIK_MEMORY_BACKEND": "vectr"})
    assert str(e.value) == (
        "AGENTIK_MEMORY_BACKEND='vectr': unknown memory backend; available: dict, md (or off)"
    )


@pytest.mark.parametrize(
    "env",
    [
        {"AGENTIK_MEMORY_BACKEND": "off"},
        {"AGENTIK_MEMORY_BACKEND": "dict", "AGENTIK_MEMORY_DIR": "off"},
        {"AGENTIK_MEMORY_BACKEND": "md", "AGENTIK_MEMORY_DIR": "OFF"},
    ],
)
def test_memory_off(env):
    plugin = DictPlugin()
    assert app_with(env, plugin)[AGENT].memory is None
    assert plugin.made == []


async def test_the_selected_backend_is_started_before_serving_and_closed_at_shutdown():
    plugin = DictPlugin()
    app = app_with({"AGENTIK_MEMORY_BACKEND": "Dictionary"}, plugin)
    backend = app[AGENT].memory
    assert plugin.made == [backend] and backend.events == []
    server = TestServer(app)
    await server.start_server()
    assert backend.events == ["start"]
    await server.close()
    assert backend.events == ["start", "close"]


async def test_a_backend_that_cannot_start_stops_start_up_naming_the_variable():
    server = TestServer(app_with({"AGENTIK_MEMORY_BACKEND": "dict"}, DictPlugin(fail_start=True)))
    with pytest.raises(StartupError, match=r"AGENTIK_MEMORY_BACKEND='dict': cannot start: no room"):
        await server.start_server()
    await server.close()


def test_the_md_backend_is_the_default(tmp_path):
    app = app_with({"AGENTIK_MEMORY_BACKEND": "", "AGENTIK_MEMORY_DIR": str(tmp_path / "m")})
    assert type(app[AGENT].memory).__name__ == "MdMemory"
    assert not (tmp_path / "m").exists()  # nothing is written before the server starts


def test_categories_and_normalised_text():
    assert check_category("world") == "world"
    with pytest.raises(NoteError, match="use one of user, world, preference"):
        check_category("misc")
    assert normalise("  The user's NAME is   Alice! ") == normalise("the user s name is alice")


def test_serve_with_an_unknown_backend_exits_with_one_line(serve):
    llm = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "k", "OPENAI_MODEL": "m"}
    proc, _ = serve({**llm, "AGENTIK_MEMORY_BACKEND": "nope"}, wait=False)
    assert proc.proc.wait(30) == 2
    lines = proc.output.strip().splitlines()
    assert lines[-1].startswith("agentik: error: AGENTIK_MEMORY_BACKEND='nope': unknown memory")
    assert "md" in lines[-1] and "Traceback" not in proc.output


async def test_without_the_default_backend_memory_is_off_and_unmentioned():
    """AGENTIK_MEMORY_BACKEND left at its default (md) whose plugin is not loaded: no memory,
    no memory tools, and nothing in the system prompt tells the model of any."""
    import agentik_memory
    from agentik.core.app import running

    app = make_app(plugins=[("agentik_memory", agentik_memory)], env={"AGENTIK_MEMORY_BACKEND": ""})
    async with running(app) as agent:
        assert agent.memory is None
        assert not [n for n in agent.tools.names() if n.startswith("memory_")]
        assert "memory" not in agent.system_prompt().lower()
