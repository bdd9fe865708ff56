"""What the agent does with its long-term memory, whatever backend holds the notes: the tools,
the prefetch block, the post-turn and pre-compaction reviews, and the curator's pass."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from agentik.core.llm import HistoryItem
from agentik.core.memory import CATEGORIES, MemoryBackend, Note, NoteError, normalise
from agentik.core.oneshot import ask_json, item_entries
from agentik.core.tools import Tool, ToolError, tool

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent

log = logging.getLogger("agentik.memory")

BLOCK_START = "[Memory context: notes from earlier conversations; use them only if they help]"
BLOCK_END = "[End of memory context]"
MAX_FACTS = 20
MAX_FACT_CHARS = 1000
#: turns of one conversation waiting for their review at most (older ones are not reviewed)
MAX_UNREVIEWED = 8

REVIEW_PROMPT = """\
You keep the long-term memory of an assistant. Read the conversation below and pick out the \
durable facts worth remembering in later conversations: about the user (category "user"), \
the user's likes, dislikes and wishes for how to be answered ("preference"), and facts about \
the world the user relies on ("world"). Leave out small talk, one-off requests, what the \
assistant said on its own and anything only true right now. Write each fact as one short \
sentence that makes sense on its own, in the language of the conversation.

Answer with JSON of exactly this shape: {{"facts": [{{"category": "user", "text": "..."}}]}}, \
one object per fact, category "user", "world" or "preference"; {{"facts": []}} when nothing \
is worth keeping.

Conversation:
{transcript}"""


def parse_facts(value: Any) -> list[tuple[str, str]]:
    """``{"facts": [{"category", "text"}]}`` or ValueError: one bad fact rejects the answer."""
    if not isinstance(value, dict) or not isinstance(value.get("facts"), list):
        raise ValueError('expected {"facts": [...]}')
    facts = []
    for item in value["facts"][:MAX_FACTS]:
        if not isinstance(item, dict) or item.get("category") not in CATEGORIES:
            raise ValueError(f"bad fact {item!r}")
        text = item.get("text")
        # normalise(): a fact without a word ("...", the prompt's placeholder) is no fact
        if not isinstance(text, str) or not normalise(text) or len(text) > MAX_FACT_CHARS:
            raise ValueError(f"bad fact text {text!r}")
        facts.append((item["category"], text.strip()))
    return facts


def render_block(notes: Sequence[Note], max_chars: int) -> tuple[str | None, list[Note]]:
    """The ``[Memory context …]`` block of as many notes as fit in ``max_chars``."""
    lines: list[str] = []
    given: list[Note] = []
    room = max_chars - len(BLOCK_START) - len(BLOCK_END) - 2
    for note in notes:
        line = f"- ({note.category}) {' '.join(note.text.split())}"
        if len(line) + 1 > room:
            if given or room < 40:
                break
            line = line[: room - 2] + "…"  # one long note: cut, not dropped
        lines.append(line)
        given.append(note)
        room -= len(line) + 1
    if not given:
        return None, []
    return "\n".join([BLOCK_START, *lines, BLOCK_END]), given


class _Serial:
    """A lock and how many reviews of one conversation hold or wait for it."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class MemoryFeature:
    """One agent's memory feature (created when the server starts, with memory on)."""

    def __init__(self, agent: ChatAgent, memory: MemoryBackend, settings: Any) -> None:
        self.agent = agent
        self.memory = memory
        self.prefetch_limit: int = settings["AGENTIK_MEMORY_PREFETCH"]
        self.prefetch_chars: int = settings["AGENTIK_MEMORY_PREFETCH_CHARS"]
        self.min_score: float = settings["AGENTIK_MEMORY_MIN_SCORE"]
        self.review_on: bool = settings["AGENTIK_MEMORY_REVIEW"]
        self.review_every: int = settings["AGENTIK_MEMORY_REVIEW_EVERY"]
        self.review_idle: float = settings["AGENTIK_MEMORY_REVIEW_IDLE"]
        #: conversation id -> the review of its unreviewed turns if no turn comes first
        self._idle: dict[str, asyncio.TimerHandle] = {}
        #: conversation id -> the review running for it (never two at once)
        self._reviews: dict[str, _Serial] = {}
        #: conversation id -> its turns not reviewed yet, as transcript entries per turn
        self._unreviewed: dict[str, list[list[str]]] = {}
        #: look-up and save of one fact at a time, so two reviews cannot both save it
        self._saving = asyncio.Lock()
        #: conversation id -> the notes its running turn was given (bumped when it ends)
        self._given: dict[str, list[str]] = {}
        #: the prefetch's search is failing (an embedding endpoint down): logged once, not per turn
        self._search_down = False

    # --- prefetch ---------------------------------------------------------------------------

    async def prefetch(self, conversation_id: str, text: str) -> str | None:
        self._given.pop(conversation_id, None)
        if self.prefetch_limit == 0 or not text.strip():
            return None
        try:
            found = await self.memory.search(text, self.prefetch_limit)
        except NoteError as e:  # the turn goes on without memory
            if not self._search_down:
                self._search_down = True
                log.warning("memory prefetch is off until search works again: %s", e)
            return None
        if self._search_down:
            self._search_down = False
            log.info("memory prefetch works again")
        relevant = [n for n in found if (n.score or 0.0) >= self.min_score]
        block, given = render_block(relevant, self.prefetch_chars)
        if given:  # counted when the turn ends: the bookkeeping never competes with the turn
            self._given[conversation_id] = [n.id for n in given]
        return block

    def turn_ended(self, conversation_id: str, user_text: str, assistant_text: str) -> None:
        """After a turn: count the notes its prefetch gave, queue its review."""
        given = self._given.pop(conversation_id, None)
        if given:
            self.agent.jobs.spawn("memory-mark-used", self.memory.mark_used(given))
        self.review_turn(conversation_id, user_text, assistant_text)

    # --- saving, with the same fact never stored twice ----------------------------------------

    async def remember(self, category: str, text: str, source: str) -> tuple[Note, bool]:
        """Save a note, or bump the note that already says the same; (note, saved anew)."""
        key = normalise(text)
        async with self._saving:
            for note in await self.memory.search(text, 10):
                if note.category == category and normalise(note.text) == key:
                    await self.memory.mark_used([note.id])
                    return note, False
            return await self.memory.save(category, text, source), True

    # --- reviews ----------------------------------------------------------------------------

    def review_turn(self, conversation_id: str, user_text: str, assistant_text: str) -> None:
        """Keep the turn for the conversation's next review. A review is due once
        ``review_every`` turns are waiting, or ``review_idle`` seconds after the last turn when
        no other came; it then runs as a background model call (``agent.background``: once the
        user pauses) over every turn of the conversation not reviewed yet."""
        if not self.review_on:
            return
        turns = self._unreviewed.setdefault(conversation_id, [])
        turns.append(
            item_entries([HistoryItem("user", user_text), HistoryItem("assistant", assistant_text)])
        )
        if len(turns) > max(MAX_UNREVIEWED, self.review_every):
            del turns[0]
            log.info("memory review of %s: the oldest unreviewed turn is left out", conversation_id)
        timer = self._idle.pop(conversation_id, None)
        if timer is not None:
            timer.cancel()
        if len(turns) >= self.review_every:
            self._submit(conversation_id)
            return
        loop = asyncio.get_running_loop()
        self._idle[conversation_id] = loop.call_later(
            self.review_idle, self._went_idle, conversation_id
        )

    def _went_idle(self, conversation_id: str) -> None:
        del self._idle[conversation_id]
        self._submit(conversation_id)  # the background waits until no turn runs

    def _submit(self, conversation_id: str) -> None:
        self.agent.background.submit(
            "memory review", conversation_id, lambda: self.review_pending(conversation_id)
        )

    async def review_pending(self, conversation_id: str) -> int:
        """Review the turns of ``conversation_id`` not reviewed yet; how many notes were saved.
        Cut short (a user turn started), it leaves them for the next try."""
        turns = list(self._unreviewed.get(conversation_id, ()))
        if not turns:
            return 0
        saved = await self.review(conversation_id, [e for t in turns for e in t], "AUTO_REVIEW")
        left = self._unreviewed.get(conversation_id, [])
        del left[: len(turns)]  # the turns that ended meanwhile stay
        if not left:
            self._unreviewed.pop(conversation_id, None)
        return saved

    def close(self) -> None:
        """Shutdown: turns not reviewed yet stay so (a review is no reason to delay a stop)."""
        for timer in self._idle.values():
            timer.cancel()
        self._idle.clear()
        self._unreviewed.clear()

    def review_items(self, conversation_id: str, items: Sequence[HistoryItem]) -> Any:
        transcript = item_entries(items)
        if not transcript:
            return None
        return self.review(conversation_id, transcript, "PRE_COMPACTION")

    async def review(self, conversation_id: str, transcript: list[str], source: str) -> int:
        """Ask the model for the durable facts of ``transcript`` (entries, oldest first) and
        save the new ones; returns how many were saved. Reviews of one conversation run one at
        a time, in order."""
        serial = self._reviews.setdefault(conversation_id, _Serial())
        serial.users += 1
        try:
            async with serial.lock:
                facts = await ask_json(
                    self.agent,
                    lambda t: REVIEW_PROMPT.format(transcript=t),
                    parse_facts,
                    feature="memory_review",
                    transcript=transcript,
                    conversation_id=conversation_id,
                    purpose=f"memory review of {conversation_id}",
                )
                saved = 0
                try:
                    for category, text in facts or ():
                        saved += (await self.remember(category, text, source))[1]
                except NoteError as e:
                    log.warning("memory review of %s stopped: %s", conversation_id, e)
                if saved:
                    log.info("memory review of %s saved %d note(s)", conversation_id, saved)
                return saved
        finally:
            serial.users -= 1
            if serial.users == 0:
                del self._reviews[conversation_id]

    def reviewing(self, conversation_id: str) -> bool:
        return conversation_id in self._reviews

    # --- tools ------------------------------------------------------------------------------

    def tools(self) -> list[Tool]:
        category = {"type": "string", "enum": list(CATEGORIES)}

        async def memory_save(category: str, text: str, source: str = "USER") -> str:
            if source not in ("USER", "AGENT"):
                raise ToolError("source must be USER or AGENT")
            try:
                note, new = await self.remember(category, text, source)
            except NoteError as e:
                raise ToolError(str(e)) from e
            return f"Saved as {note.id}." if new else f"Already remembered as {note.id}."

        async def memory_read(query: str) -> str:
            try:
                notes = await self.memory.search(query, 10)
            except NoteError as e:
                raise ToolError(str(e)) from e
            return "\n".join(map(line, notes)) if notes else "No matching notes."

        async def memory_list(category: str, offset: int = 0, limit: int = 20) -> str:
            try:
                notes = await self.memory.list(category, offset, min(max(limit, 1), 100))
            except NoteError as e:
                raise ToolError(str(e)) from e
            return "\n".join(map(line, notes)) if notes else f"No {category} notes here."

        async def memory_delete(id: str) -> str:
            try:
                deleted = await self.memory.delete(id, recoverable=True)
            except NoteError as e:
                raise ToolError(str(e)) from e
            if not deleted:
                raise ToolError(f"no note with id {id!r}")
            return f"Deleted {id}."

        def line(note: Note) -> str:
            return f"- {note.id} ({note.category}) {' '.join(note.text.split())}"

        return [
            tool(
                memory_save,
                description="Remember a durable fact for later conversations. source: USER "
                "when the user asked you to remember it, AGENT when you decided to.",
                parameters=schema(
                    category=category,
                    text={"type": "string"},
                    source={"type": "string", "enum": ["USER", "AGENT"]},
                ),
            ),
            tool(
                memory_read,
                description="Search long-term memory; the best matching notes with their ids.",
                parameters=schema(query={"type": "string"}),
            ),
            tool(
                memory_list,
                description="List the notes of one category, oldest first, a page at a time.",
                parameters=schema(
                    category=category,
                    offset={"type": "integer", "minimum": 0},
                    limit={"type": "integer", "minimum": 1, "maximum": 100},
                ),
            ),
            tool(
                memory_delete,
                description="Forget a note by its id (it is moved to an archive).",
                parameters=schema(id={"type": "string"}),
            ),
        ]


def schema(**props: dict[str, Any]) -> dict[str, Any]:
    required = [p for p in props if p in ("category", "text", "query", "id")]
    return {"type": "object", "properties": props, "required": required}


async def curate(memory: MemoryBackend, max_age: timedelta) -> int:
    """The curator's pass: archive notes never used and older than ``max_age``."""
    archived = await memory.archive_stale(max_age)
    if archived:
        log.info("[Curator] archived %d stale notes", archived)
    return archived
