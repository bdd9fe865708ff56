"""agentik-memory-json: long-term memory in one JSON file (``AGENTIK_MEMORY_BACKEND=json``).

agentik's memory feature gives any backend the ``memory_*`` tools, the ``[Memory context …]``
block before each turn, the review and the curator: this plugin only stores and finds notes.
"""

import asyncio
import json
import os
import re
import uuid
from datetime import UTC, datetime

from agentik.api import MemoryBackend, Note, Setting, check_category, hookimpl, parse_path

WORD = re.compile(r"\w{3,}")


def words(text):
    """Lower-case words, a plural's ``s`` dropped: "Dogs" and "dog" meet."""
    return {w.casefold().removesuffix("s") for w in WORD.findall(text)}


class JsonMemory(MemoryBackend):
    def __init__(self, path):
        self.path = path
        self.notes = {}  # id -> note as JSON; "archived" ones are kept apart, restorable
        self.archived = {}
        self.lock = asyncio.Lock()  # one writer at a time (turns, reviews, the curator)

    async def start(self):
        if self.path.exists():
            data = json.loads(self.path.read_text())
            self.notes = {n["id"]: n for n in data["notes"]}
            self.archived = {n["id"]: n for n in data.get("archived", [])}

    def describe(self):
        return f"json ({self.path}, {len(self.notes)} notes)"

    async def _write(self):
        data = {"notes": list(self.notes.values()), "archived": list(self.archived.values())}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False))
        os.replace(tmp, self.path)  # a crash leaves the old file or the new one, never half

    @staticmethod
    def _note(n, score=None):
        used = n.get("last_used")
        return Note(
            n["id"],
            n["category"],
            n["text"],
            n["source"],
            datetime.fromisoformat(n["created"]),
            datetime.fromisoformat(used) if used else None,
            n.get("uses", 0),
            score,
        )

    async def save(self, category, text, source):
        check_category(category)
        note = {
            "id": uuid.uuid4().hex[:12],
            "category": category,
            "text": text,
            "source": source,
            "created": datetime.now(UTC).isoformat(),
            "uses": 0,
        }
        async with self.lock:
            self.notes[note["id"]] = note
            await self._write()
        return self._note(note)

    async def search(self, query, limit):
        wanted = words(query)
        found = []
        for n in self.notes.values():
            shared = wanted & words(n["text"])
            if shared:  # one shared word passes the prefetch's 0.5; more score higher
                found.append((0.5 + 0.5 * len(shared) / len(wanted), n))
        found.sort(key=lambda pair: -pair[0])
        return [self._note(n, score) for score, n in found[:limit]]

    async def get(self, note_id):
        n = self.notes.get(note_id)
        return self._note(n) if n else None

    async def list(self, category, offset=0, limit=50):
        check_category(category)
        mine = [n for n in self.notes.values() if n["category"] == category]
        return [self._note(n) for n in mine[offset : offset + limit]]

    async def delete(self, note_id, recoverable=True):
        async with self.lock:
            n = self.notes.pop(note_id, None)
            if n is None:
                return False
            if recoverable:
                self.archived[note_id] = n
            await self._write()
        return True

    async def mark_used(self, note_ids):
        now = datetime.now(UTC).isoformat()
        async with self.lock:
            for note_id in note_ids:
                if note_id in self.notes:
                    self.notes[note_id]["uses"] = self.notes[note_id].get("uses", 0) + 1
                    self.notes[note_id]["last_used"] = now
            await self._write()

    async def archive_stale(self, max_age):
        cutoff = datetime.now(UTC) - max_age
        async with self.lock:
            stale = [
                i
                for i, n in self.notes.items()
                if not n.get("uses") and datetime.fromisoformat(n["created"]) < cutoff
            ]
            for note_id in stale:
                self.archived[note_id] = self.notes.pop(note_id)
            if stale:
                await self._write()
        return len(stale)

    async def count(self):
        return len(self.notes)


@hookimpl
def register_settings(register):
    register(
        Setting("JSON_MEMORY_PATH", "~/.agentik/memory.json", parse_path, "The json memory's file.")
    )


@hookimpl
def register_memory_backends(register):
    register("json", lambda settings: JsonMemory(settings["JSON_MEMORY_PATH"]))
