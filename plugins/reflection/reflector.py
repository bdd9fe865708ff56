"""The reflector of one agent: when to reflect, the one-shot call, the ``reflection`` table and
the latest weak spots for the system prompt."""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING, Any, cast

import peewee

from agentik.core.models import for_agent
from agentik.core.oneshot import ask_json, transcript_entries
from agentik.core.store import utcnow

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent
    from agentik.core.conversation import ChatConversation
    from agentik.core.db import Database

log = logging.getLogger(__name__)

HEADING = "Self-reflection: your recent weak spots"
#: the shape the prompt shows; a small model may give it back as its answer
EXAMPLE = {"score": 3, "weakSpots": ["...", "..."]}
PROMPT = (
    """Review how the assistant did in this recent part of a conversation with a user. \
Score it from 1 (poor) to 5 (excellent) and name its weak spots: short, concrete and \
actionable (for example "answers too long", "did not ask which city was meant"); an empty list \
when there are none.

Answer with JSON of exactly this shape: """
    + json.dumps(EXAMPLE).replace("{", "{{").replace("}", "}}")
    + """

The conversation:
{transcript}
"""
)
MAX_SPOTS, MAX_SPOT_CHARS = 5, 200
#: the output cap of the answer: a score and five short weak spots
MAX_TOKENS = 300


class Reflection(peewee.Model):
    """One reflection: a conversation's score and weak spots after ``turns`` user turns."""

    id = peewee.AutoField()
    conversation_id = peewee.TextField(index=True)
    turns = peewee.IntegerField()
    score = peewee.IntegerField()
    weak_spots_json = peewee.TextField()
    created_at = peewee.TextField()

    class Meta:
        table_name = "reflection"


def reflection_model() -> type[Reflection]:
    """This agent's subclass of the table (:func:`agentik.core.models.for_agent`)."""
    (model,) = for_agent(Reflection)
    return cast(type[Reflection], model)


def validate(value: Any) -> tuple[int, list[str]]:
    """``{"score": 1..5, "weakSpots": [str, ...]}`` and nothing else; weak spots without a word
    (``"..."``) are dropped, and the prompt's own example given back is no answer."""
    if value == EXAMPLE:
        raise ValueError("the answer is the prompt's example")
    if not isinstance(value, dict) or set(value) != {"score", "weakSpots"}:
        raise ValueError(f'expected {{"score", "weakSpots"}}, got {json.dumps(value)[:200]}')
    score, spots = value["score"], value["weakSpots"]
    if not isinstance(score, int) or isinstance(score, bool) or not 1 <= score <= 5:
        raise ValueError(f"score must be an integer from 1 to 5, got {score!r}")
    if not isinstance(spots, list) or not all(isinstance(s, str) for s in spots):
        raise ValueError("weakSpots must be a list of strings")
    cleaned = [" ".join(s.split())[:MAX_SPOT_CHARS] for s in spots]
    return score, [s for s in cleaned if re.search(r"\w", s)][:MAX_SPOTS]


class Reflector:
    def __init__(
        self,
        agent: ChatAgent,
        db: Database,
        model: type[Reflection],
        interval: int,
        top_k: int,
    ) -> None:
        self.agent, self.db, self.model = agent, db, model
        self.interval, self.top_k = interval, top_k
        self.running: set[str] = set()  # conversations being reflected on now
        # each conversation's turn count at its last attempt in this process (a dropped answer
        # is an attempt too: the next one comes ``interval`` turns later, not at the next turn)
        self.attempted: dict[str, int] = {}
        self.latest: list[tuple[int, list[str]]] = []  # (score, weak spots), newest first

    async def load(self) -> None:
        self.latest = await self.db.read(self._latest)

    def _latest(self) -> list[tuple[int, list[str]]]:
        if not self.top_k:
            return []
        m = self.model
        rows = m.select().order_by(m.id.desc()).limit(self.top_k)
        return [(r.score, json.loads(r.weak_spots_json)) for r in rows]

    def prompt_section(self) -> str | None:
        spots = list(dict.fromkeys(s for _score, spots in self.latest for s in spots))
        if not spots:
            return None
        lines = "\n".join(f"- {s}" for s in spots)
        return f"{HEADING} (avoid repeating them):\n{lines}"

    async def after_turn(self, conv: ChatConversation) -> None:
        """When ``interval`` user turns passed since the last reflection on ``conv`` (counted in
        the store, so a restart or queued messages never skip one), queue a reflection: a
        background model call that runs once the user pauses (``agent.background``)."""
        turns = await conv.count_turns()
        last = self.attempted.get(conv.id)
        if last is None:
            last = await self.db.read(lambda: self._last_turns(conv.id))
        if turns - last >= self.interval:
            self.attempted[conv.id] = turns  # the next one is due ``interval`` turns later
            self.agent.background.submit("reflection", conv.id, lambda: self.reflect(conv, turns))

    def _last_turns(self, conversation_id: str) -> int:
        m = self.model
        last = (
            m.select(m.turns)
            .where(m.conversation_id == conversation_id)
            .order_by(m.id.desc())
            .limit(1)
            .scalar()
        )
        return int(last or 0)

    async def reflect(self, conv: ChatConversation, turns: int | None = None) -> dict[str, Any]:
        """One reflection on the last ``interval`` turns of ``conv``; what it did, as JSON."""
        out: dict[str, Any] = {"conversationId": conv.id}
        if conv.id in self.running:
            return {**out, "reflected": False, "reason": "a reflection is already running"}
        self.running.add(conv.id)
        try:
            if turns is None:
                turns = await conv.count_turns()
            self.attempted[conv.id] = turns
            transcript = transcript_entries(await conv.recent_turns(self.interval))
            if not transcript:
                return {**out, "reflected": False, "reason": "no turns to reflect on"}
            answer = await ask_json(
                self.agent,
                lambda t: PROMPT.format(transcript=t),
                validate,
                feature="reflection",
                max_tokens=MAX_TOKENS,
                transcript=transcript,
                conversation_id=conv.id,
                purpose=f"reflection on {conv.id}",
            )
            if answer is None:
                return {**out, "reflected": False, "reason": "no valid answer (logged)"}
            score, spots = answer
            await self.db.write(lambda: self._insert(conv.id, turns, score, spots))
            self.latest = [(score, spots), *self.latest][: self.top_k]
            log.info("reflection on %s: score %d, weak spots %s", conv.id, score, spots)
            return {**out, "reflected": True, "turns": turns, "score": score, "weakSpots": spots}
        finally:
            self.running.discard(conv.id)

    def _insert(self, conversation_id: str, turns: int, score: int, spots: list[str]) -> None:
        self.model.insert(
            conversation_id=conversation_id,
            turns=turns,
            score=score,
            weak_spots_json=json.dumps(spots, ensure_ascii=False),
            created_at=utcnow().isoformat(),
        ).execute()
