"""Skill mining (F7): a background look at a conversation's last turns for reusable skills.

Every ``interval`` completed turns of a conversation (counted in the store, its Assistant
records, when the live conversation is first seen; then one more per turn), one one-shot call
shows the model the last ``max_turns`` turns and the catalogue and asks for
``{"skills": [{"name", "description", "body"}]}``. Each skill is checked like a hand-written
one and saved through the catalogue: the same name updates it, a near-duplicate (see
:func:`find_near`) updates the skill it is near instead of adding another, an invalid one is
logged and dropped. One mining at a time per skills folder; turns never wait for it: the call is
a background one (``agent.background``), run once the user pauses.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentik.core.oneshot import ask_json, transcript_entries
from agentik_skills.folder import SkillCatalogue
from agentik_skills.format import Skill, SkillError, clean_description, name_parts

if TYPE_CHECKING:
    from agentik.core.conversation import ChatConversation

log = logging.getLogger("agentik.skills")

SYSTEM_PROMPT = (
    "You maintain the skill library of an AI assistant: short, reusable instructions for tasks "
    "it is likely to meet again."
)
PROMPT = """Read the end of a conversation between a user and the assistant below, and the \
skills the assistant already has. Find what is worth keeping as a skill: a procedure that \
worked, a fix that was found, a convention the user asked for, that will be useful again. \
Leave out one-off facts, small talk and anything already covered by an existing skill. To \
improve an existing skill, use its exact name.

Each skill has:
- "name": lowercase letters, digits and single hyphens, at most 64 characters; ":" nests \
(e.g. "backend:spring:db-base");
- "description": one line, what it does and when to use it (at most 1024 characters);
- "body": the instructions, in markdown.

Answer {{"skills": [{{"name": "...", "description": "...", "body": "..."}}]}}, or \
{{"skills": []}} when there is nothing worth keeping.

Existing skills:
{catalogue}

Conversation:
{transcript}"""
#: the output cap of the answer: a few skills with short bodies
MAX_TOKENS = 800


@dataclass
class MiningReport:
    """What one mining run did (the debug endpoint returns it as JSON)."""

    conversation_id: str
    saved: list[str] = field(default_factory=list)  # created or updated, by final name
    created: list[str] = field(default_factory=list)
    dropped: list[dict[str, str]] = field(default_factory=list)  # {"name", "reason"}
    busy: bool = False  # another mining run was going on: this one did nothing
    error: str | None = None  # no usable answer (the call failed or it was malformed)

    def to_json(self) -> dict[str, Any]:
        return {
            "conversationId": self.conversation_id,
            "saved": self.saved,
            "created": self.created,
            "dropped": self.dropped,
            "busy": self.busy,
            "error": self.error,
        }


def parse_answer(value: Any) -> list[Any]:
    """The ``skills`` list of an answer shaped exactly ``{"skills": [...]}``."""
    if not isinstance(value, dict) or set(value) != {"skills"}:
        raise ValueError('the answer is not {"skills": [...]}')
    if not isinstance(value["skills"], list):
        raise ValueError('"skills" is not a list')
    return value["skills"]


def near_key(name: str) -> str:
    """Two names with the same key are near-duplicates: hyphens do not count and a trailing
    ``-<number>`` is dropped (``git-rebase``, ``gitrebase``, ``git-rebase-2``)."""
    return re.sub(r"-\d+$", "", name).replace("-", "")


def _words(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def find_near(name: str, description: str, skills: list[Skill]) -> Skill | None:
    """An existing skill a mined one duplicates: the same :func:`near_key`, or the same
    description up to case, spaces and punctuation."""
    key, words = near_key(name), _words(description)
    for skill in skills:
        if near_key(skill.name) == key or _words(skill.description) == words:
            return skill
    return None


class SkillMiner:
    def __init__(self, catalogue: SkillCatalogue, interval: int, max_turns: int) -> None:
        self.catalogue = catalogue
        self.interval = interval  # 0: never on its own; mine() still works
        self.max_turns = max_turns
        self._running = False

    # Completed turns of a live conversation, kept in its ``state``: counted in the store (its
    # Assistant records) the first time it is seen, then one more per after_turn. Counting in
    # the store at every turn costs O(turns) per turn (B18); a conversation dropped from
    # memory and reloaded is counted again.
    STATE = "agentik_skills.turns"

    @property
    def running(self) -> bool:
        return self._running

    def after_turn(self, conversation: ChatConversation) -> Awaitable[Any] | None:
        """The ``after_turn`` hook: queues a mining pass (a background model call) when the
        conversation's completed turns are a multiple of the interval, else nothing (no job, no
        query); an awaitable only for a conversation whose turns it must count first."""
        if not self.interval:
            return None
        count = conversation.state.get(self.STATE)
        if count is None:  # the first turn of this live object: count in the store, once
            return self._count_then_mine(conversation)
        conversation.state[self.STATE] = count = count + 1
        if count % self.interval == 0:
            self._mine_later(conversation, count)
        return None

    async def _count_then_mine(self, conversation: ChatConversation) -> None:
        turns = (await conversation.store.token_stats(conversation.id)).turns
        conversation.state.setdefault(self.STATE, turns)
        if turns and turns % self.interval == 0:
            self._mine_later(conversation, turns)

    def _mine_later(self, conversation: ChatConversation, turns: int) -> None:
        conversation.agent.background.submit(
            "skill mining", conversation.id, lambda: self._mine_after(conversation, turns)
        )

    async def _mine_after(self, conversation: ChatConversation, turns: int) -> None:
        if self._running:
            log.info("[SkillMiner] busy: skipped after turn %d of %s", turns, conversation.id)
            return
        await self.mine(conversation)

    async def mine(self, conversation: ChatConversation) -> MiningReport:
        """Mine ``conversation``'s last turns now; returns what it did. Never raises on a bad
        answer; a second call while one runs returns at once with ``busy``."""
        report = MiningReport(conversation.id)
        if self._running:
            report.busy = True
            return report
        self._running = True
        try:
            await self._mine(conversation, report)
        finally:
            self._running = False
        return report

    async def _mine(self, conversation: ChatConversation, report: MiningReport) -> None:
        records = await conversation.store.recent_turns(conversation.id, self.max_turns)
        transcript = transcript_entries(records)
        if not transcript:
            return
        skills = await asyncio.to_thread(self.catalogue.skills)
        listing = "\n".join(f"- {s.name}: {s.description}" for s in skills) or "(none)"
        items = await ask_json(
            conversation.agent,
            lambda t: PROMPT.format(catalogue=listing, transcript=t),
            parse_answer,
            feature="skill_mining",
            max_tokens=MAX_TOKENS,
            transcript=transcript,
            system_prompt=SYSTEM_PROMPT,
            conversation_id=conversation.id,
            purpose="[SkillMiner]",
        )
        if items is None:
            report.error = "the model's answer was not usable (see the log)"
            return
        taken: set[str] = set()
        for item in items:
            name = item.get("name") if isinstance(item, dict) else None
            try:
                target, description, body = self._check(item, skills, taken)
                skill, created = await asyncio.to_thread(
                    self.catalogue.save, target, description, body
                )
            except (SkillError, OSError) as e:
                log.warning("[SkillMiner] dropped %r: %s", name, e)
                report.dropped.append({"name": str(name), "reason": str(e)})
                continue
            taken.add(near_key(skill.name))
            report.saved.append(skill.name)
            if created:
                report.created.append(skill.name)
            skills = [s for s in skills if s.name != skill.name] + [skill]
        if report.saved:
            log.info(
                "[SkillMiner] saved %d skill%s: %s",
                len(report.saved),
                "" if len(report.saved) == 1 else "s",
                ", ".join(report.saved),
            )
        else:
            log.info("[SkillMiner] nothing new in %s", conversation.id)

    def _check(self, item: Any, skills: list[Skill], taken: set[str]) -> tuple[str, str, str]:
        """The name to save under, the description and the body of one mined skill."""
        if not isinstance(item, dict):
            raise SkillError("not an object")
        body = item.get("body")
        if not isinstance(body, str) or not body.strip():
            raise SkillError("the body must be a non-empty string")
        name = ":".join(name_parts(item.get("name")))
        description = clean_description(item.get("description"))
        if near_key(name) in taken:
            raise SkillError("this answer already holds that skill")
        if all(s.name != name for s in skills):
            near = find_near(name, description, skills)
            if near is not None:
                if near_key(near.name) in taken:
                    raise SkillError(f"near {near.name!r}, which this answer already saved")
                log.info("[SkillMiner] %r is near %r: updating that one", name, near.name)
                name = near.name
        return name, description, body
