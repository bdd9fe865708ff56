"""``AGENTIK_APPROVAL_TIMEOUT``: an approval nobody answered in time is denied."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from agentik.core.approvals import APPROVAL
from agentik.core.inbox import NotWaiting
from agentik.core.records import utcnow
from agentik.core.turns import TurnState
from agentik.core.types import UnknownReference

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent

log = logging.getLogger(__name__)


async def deny_expired(agent: ChatAgent, after: float) -> int:
    """Deny every approval asked more than ``after`` seconds ago; returns how many."""
    cutoff = utcnow() - timedelta(seconds=after)
    denied = 0
    # temporary conversations keep their turns in memory, apart from the database (alone on
    # it: where instances share it, they are in it with the others and temp_store is empty)
    turns = [*await agent.store.open_turns(), *await agent.temp_store.open_turns()]
    for turn in turns:
        if turn.state is not TurnState.WAITING:
            continue
        for wait in turn.waits:
            asked = wait.request.get("requestedAt")
            if wait.kind != APPROVAL or wait.answered or asked is None:
                continue
            if datetime.fromisoformat(asked) > cutoff:
                continue
            conv = await agent.get_conversation(turn.conversation_id)
            if conv is None:
                continue
            answer = {"approve": False, "reason": "timeout"}
            try:
                await conv.resume_turn(turn.id, wait.call_id, answer)
            except (NotWaiting, UnknownReference):  # answered or ended meanwhile
                continue
            denied += 1
            log.info(
                "approval of %s (%s) in %s denied: no answer within %g s",
                wait.request.get("toolName"),
                wait.call_id,
                turn.conversation_id,
                after,
            )
    return denied
