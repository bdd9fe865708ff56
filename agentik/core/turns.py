"""A turn as durable state: its states, the moves between them, and its stored record.

Every send makes a turn (its id is the user message's id)::

    queued ──► running ◄──► waiting
      │           │            │
      └───────────┴────────────┴──► done | failed | cancelled   (waiting: not done)

``queued``: accepted, not started (the FIFO of a conversation is its queued turns, in order).
``running``: it has recorded at least one step; after a crash it resumes from the last one.
``waiting``: a step waits for an answer from outside (:class:`Wait`); no task holds it.
The three others are final. :func:`check_move` is the one place that says which moves exist.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from agentik.core.types import Message


class TurnState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in FINAL


FINAL = frozenset({TurnState.DONE, TurnState.FAILED, TurnState.CANCELLED})
OPEN = (TurnState.QUEUED, TurnState.RUNNING, TurnState.WAITING)

_MOVES: dict[TurnState, frozenset[TurnState]] = {
    # a turn's first stored step may already end it, or wait: queued goes anywhere but back
    TurnState.QUEUED: frozenset(TurnState) - {TurnState.QUEUED},
    # staying: a further step of a running turn, a further answer to a waiting one
    TurnState.RUNNING: frozenset(TurnState) - {TurnState.QUEUED},
    TurnState.WAITING: frozenset(TurnState) - {TurnState.QUEUED, TurnState.DONE},
    TurnState.DONE: frozenset(),
    TurnState.FAILED: frozenset(),
    TurnState.CANCELLED: frozenset(),
}


class TurnStateError(Exception):
    """A move between turn states that does not exist (a bug, or a stale writer)."""


def check_move(old: TurnState, new: TurnState) -> None:
    """Raise :class:`TurnStateError` unless a turn may go from ``old`` to ``new``. Staying in
    ``running`` (a further step) and in ``waiting`` (a further answer) are moves too."""
    if new not in _MOVES[old]:
        raise TurnStateError(f"a turn cannot go from {old} to {new}")


#: the kind of the wait of a call to a tool the turn was offered by a ``turn_tools`` hook: the
#: agent does not run it, whoever offered it does and answers with its result
CLIENT_TOOL = "client_tool"


@dataclass(frozen=True, slots=True)
class Wait:
    """What a waiting step needs from outside, one per tool call it holds: ``kind`` names who
    asked and understands the answer (e.g. ``"approval"``), ``request`` is what clients are
    shown (JSON), ``answer`` is None until :meth:`ChatConversation.resume_turn` gives one."""

    call_id: str
    kind: str
    request: dict[str, Any] = field(default_factory=dict)
    answer: Any = None
    answered: bool = False
    #: an instance went on with the answers (where instances share the store): a turn found
    #: running with them had begun its calls, and is cut, not still to be taken up
    taken: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"callId": self.call_id, "kind": self.kind, "request": self.request}
        if self.answered:
            out["answer"] = self.answer
        if self.taken:
            out["taken"] = True
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Wait:
        return cls(
            raw["callId"],
            raw["kind"],
            raw.get("request") or {},
            raw.get("answer"),
            "answer" in raw,
            bool(raw.get("taken")),
        )


@dataclass(frozen=True, slots=True)
class TurnUpdate:
    """A change of a turn's record written with the rows of a step (same transaction):
    its new state, how many model replies it has recorded, and what it waits for."""

    state: TurnState
    step: int
    waits: tuple[Wait, ...] = ()


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """A turn as stored: its user message, state, recorded steps and waits."""

    user: Message
    state: TurnState
    step: int = 0
    waits: tuple[Wait, ...] = ()
    updated_at: datetime | None = None

    @property
    def id(self) -> str:
        return self.user.id

    @property
    def conversation_id(self) -> str:
        return self.user.conversation_id

    def to_json(self) -> dict[str, Any]:
        """The turn as the HTTP API shows it beside its message."""
        out: dict[str, Any] = {"id": self.id, "state": str(self.state), "step": self.step}
        if self.waits:
            out["waits"] = [w.to_json() for w in self.waits]
        return out


def answered(turn: TurnRecord, call_id: str, answer: Any) -> TurnRecord:
    """``turn`` with the wait of ``call_id`` answered: ``running`` once every wait of its step
    is, else still ``waiting``. :class:`TurnStateError` when it is not waiting for that
    answer (over, running, or answered already)."""
    wait = next((w for w in turn.waits if w.call_id == call_id), None)
    if turn.state is not TurnState.WAITING or wait is None or wait.answered:
        raise TurnStateError(f"turn {turn.id} does not wait for an answer to {call_id}")
    waits = tuple(replace(w, answer=answer, answered=True) if w is wait else w for w in turn.waits)
    state = TurnState.RUNNING if all(w.answered for w in waits) else TurnState.WAITING
    return replace(turn, state=state, waits=waits)


def waits_json(waits: tuple[Wait, ...]) -> list[dict[str, Any]] | None:
    return [w.to_json() for w in waits] if waits else None


def waits_from(raw: list[dict[str, Any]] | None) -> tuple[Wait, ...]:
    return tuple(Wait.from_json(w) for w in raw or ())


def sources(new: TurnState) -> tuple[TurnState, ...]:
    """The states a turn may be in to move to ``new`` (what a store's update checks)."""
    return tuple(old for old, moves in _MOVES.items() if new in moves)
