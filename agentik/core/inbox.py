"""The inbox of one conversation: it accepts sends (durably, once per idempotency key), keeps
their turns in order and runs them one at a time; a waiting turn holds the line, without a
task, until it is answered (:meth:`Inbox.answer`) or interrupted.

Where instances share the store (agentik.core.ownership), the turns run on the conversation's
owner only: a send or an answer another instance takes is stored there, then the worker here
takes the lease (free, or its owner gone) or wakes the owner, whose inbox takes it up from the
store (:meth:`Inbox.refresh`)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentik.core import approvals
from agentik.core.approvals import APPROVAL
from agentik.core.records import error_record, new_id, utcnow
from agentik.core.runner import RESTART_ERROR
from agentik.core.store.base import LeaseLost
from agentik.core.turns import TurnRecord, TurnState, TurnStateError
from agentik.core.types import (
    MAX_IMAGE_BYTES,
    ContentPart,
    End,
    Error,
    ImagePart,
    InvalidInput,
    Message,
    MessageContext,
    UnknownReference,
    UserMessage,
    Via,
    content_to_json,
)

if TYPE_CHECKING:
    from agentik.core.conversation import ChatConversation

log = logging.getLogger(__name__)

#: the code of the Error (record and event) that ends a turn cancelled before it started
CANCELLED = "cancelled"
CANCELLED_ERROR = "cancelled before it started"


class ConversationClosed(Exception):
    """The conversation was deleted or closed; it takes no more messages."""


class NotWaiting(Exception):
    """An answer for a turn that does not wait for it (over, running, or already answered);
    transports answer it with a 409."""


class Inbox:
    def __init__(self, conv: ChatConversation, open_turns: Sequence[TurnRecord] = ()) -> None:
        self.conv = conv
        self.queue: deque[TurnRecord] = deque()  # accepted, not started
        #: the turn at the head that holds the line: waiting, or found running at start-up
        self.held: TurnRecord | None = None
        self.worker: asyncio.Task[None] | None = None
        self.sending = 0  # sends between their first line and their queued turn
        self.unconfirmed: set[str] = set()  # keyed sends whose write raised (see accept)
        self.turns: int | None = None  # user messages stored, once counted
        self.sends = 0  # sends started (Conversation.count_turns: did one overlap a count?)
        self._cut: set[str] = set()  # turns a crash stopped while they ran
        self._cancel: str | None = None  # the waiting turn an interrupt ends
        self._answered: dict[str, TurnRecord] = {}  # answers that came while a run returned
        #: the trace headers of the requests that answered a waiting turn, by turn (its span
        #: links to them when it goes on; kept only while something observes)
        self._answer_traces: dict[str, list[dict[str, str]]] = {}
        self._answering = asyncio.Lock()
        self._reload = False  # the store holds turns of it this inbox has not taken up
        self._nudge = False  # ... that this instance stored: its owner must hear of them
        #: sends stored through this instance while another owned the conversation: a
        #: take-over's resume rules leave them alone (the last owner never had them)
        self._sent_here: set[str] = set()
        #: the lease was taken from another owner: the worker's next take-up applies the
        #: resume rules first (True: that owner ended without a hand-over)
        self._settle: bool | None = None
        #: the turn the worker took to run now (it may not be recorded running yet)
        self.taken: str | None = None
        #: queued turns cancelled in the store that a read of it may still bring in
        self._dropped: set[str] = set()
        for record in open_turns:
            if record.state is TurnState.QUEUED:
                self.queue.append(record)
            elif self.held is None:
                self.held = record
                # alone on its store, a running turn found at start-up was cut by a crash;
                # where instances share it, another may run it now (_take_up decides)
                if record.state is TurnState.RUNNING and not conv.ownership.shared:
                    self._cut.add(record.id)

    @property
    def running(self) -> bool:
        return self.worker is not None and not self.worker.done()

    @property
    def stalled(self) -> bool:
        """Its worker stopped on a database error with the store still to take up (a waiting
        turn an interrupt is ending, say, which no sweep of the store would find)."""
        return self._reload and not self.running and not self.sending

    def check(self, content: Sequence[ContentPart]) -> None:
        """Refuse what the model cannot take, before anything is stored."""
        if not content:
            raise InvalidInput("content must not be empty")
        images = [p for p in content if isinstance(p, ImagePart)]
        if not images:
            return
        caps = self.conv.agent.llm.capabilities or {}
        if not caps.get("image_input"):
            raise InvalidInput("this agent's model does not accept image input")
        if any(p.url is not None for p in images) and not caps.get("image_url_input", True):
            raise InvalidInput("this agent's model takes images as data, not as a url")
        if any(p.data is not None and len(p.data) * 3 // 4 > MAX_IMAGE_BYTES for p in images):
            raise InvalidInput(f"an image may be at most {MAX_IMAGE_BYTES // 2**20} MB")

    async def accept(
        self,
        content: Sequence[ContentPart],
        context: MessageContext | None,
        idempotency_key: str | None,
        via: Via | None = None,
    ) -> Message:
        self.check(content)
        payload: dict[str, Any] = {"content": content_to_json(list(content))}
        if context is not None:
            payload["context"] = context.to_json()
        if via is not None:
            payload["via"] = via.to_json()
        if self.conv.agent.observers:  # the turn, even resumed after a restart, joins its trace
            trace = self.conv.agent.observers.trace_context()
            if trace is not None:
                payload["trace"] = trace
        msg = Message(new_id("msg"), self.conv.id, "user", utcnow(), payload)
        # shielded: once the write started, the turn is queued even if the caller goes away
        # (a client that disconnects before its 202)
        self.sending += 1  # from now on the conversation is not idle
        self.sends += 1
        return await asyncio.shield(self._store(msg, idempotency_key))

    async def _store(self, msg: Message, idempotency_key: str | None) -> Message:
        conv = self.conv
        counted = self.turns is not None  # a count made while this write waits includes it
        try:
            record = await conv.store.add_user_message(msg, idempotency_key=idempotency_key)
        except Exception as e:
            if conv.closed:  # deleted while the write waited
                raise ConversationClosed(f"conversation {conv.id} was deleted") from e
            if idempotency_key is not None:
                # the commit may have happened all the same (the fsync after it failed): the
                # client's retry with this key finds the message, and runs it then
                self.unconfirmed.add(msg.id)
            raise
        finally:
            self.sending -= 1
        if record.id != msg.id:  # a retry: the first send queued its turn
            if record.id not in self.unconfirmed:
                return record.user
            self.unconfirmed.discard(record.id)  # stored, but its sender got an error
        if counted:
            self.turns = (self.turns or 0) + 1
        conv.updated_at = record.user.created_at
        conv.agent.touch(conv.id)
        if conv.agent.observers:  # in the sender's task: a tracer reads its request's context
            conv.agent.observers.accepted(conv, record.user)
        if not conv.ownership.owns(conv.id):
            # another instance may run this conversation: its owner announces and runs it
            self._sent_here.add(record.id)
            self.refresh(nudge=True)
            return record.user
        self.queue.append(record)
        if conv.ownership.shared:
            # sends another instance stored before this one may not have reached this queue
            # yet (their wake is on its way): the store's order first, before the next turn
            self._reload = True
        self.start()
        self._announce(record)
        return record.user

    def _announce(self, record: TurnRecord) -> None:
        conv = self.conv
        accepted = UserMessage.of(record.user)  # every viewer sees what starts the turns after
        conv.log.publish(accepted)
        conv.agent.announce(accepted)
        conv.agent.publish("ConversationUpdated", conv.id)

    def start(self) -> None:
        # a stopping server starts no turn: what is queued runs after the next start
        if self.running or self.conv.closed or self.conv.agent.stopping:
            return
        if self._holding() and not self._reload:
            return
        self.worker = asyncio.create_task(self._drain(), name=f"turns-{self.conv.id}")

    def refresh(self, *, nudge: bool = False) -> None:
        """The store holds turns of this conversation this inbox has not taken up (stored by
        another instance, answered there, or left by an owner that is gone): the worker takes
        the lease and takes them up, between two turns. ``nudge``: this instance stored them,
        and tells the owner if another instance is one."""
        self._reload = True
        self._nudge |= nudge
        self.start()

    async def take_over(self, *, unclean: bool) -> int:
        """The sweeper took this conversation's lease: the worker takes up what its last owner
        left, after the resume rules (``unclean``: it ended without handing it over, so its
        first queued turn may have started); returns how many turns the store has to run.
        The worker does it, not the sweeper: one may have started while the lease was taken
        (a send here, a wake), and two take-ups of one store's turns would run one twice."""
        self._settle = unclean or bool(self._settle)
        self.refresh()
        turns = await self.conv.store.open_turns(self.conv.id)
        kept, _ = self._resume_rules(turns, self._settle)
        return sum(t.state is not TurnState.WAITING for t in kept)

    def _holding(self) -> bool:
        """A waiting turn holds the line (and no interrupt is ending it)."""
        held = self.held
        return held is not None and held.state is TurnState.WAITING and held.id != self._cancel

    async def _drain(self) -> None:
        conv = self.conv
        ownership = conv.ownership
        try:
            if not ownership.owns(conv.id):
                if not await ownership.take(conv.id):
                    # another instance runs its turns: what this one holds of them is stale
                    if self._nudge:
                        ownership.wake(conv.id)
                    self._reload = self._nudge = False
                    self.queue.clear()
                    self._sent_here.clear()
                    self.held = None
                    self._cut.clear()
                    return
                self._reload = True  # taken: the store has what the last owner left, or sends
            self._nudge = False
            with ownership.fenced(conv.id):
                await self._run_turns()
        except LeaseLost:  # another instance took the conversation over
            ownership.lost(conv.id)
            return
        except Exception as e:  # the database is away (a read of it, the lease's write)
            # the next start takes up the store (where instances share it, the sweep of the
            # conversation's owner starts one)
            log.warning("the turns of %s stopped: %s", conv.id, e)
            self._reload = True
            return
        # once this worker is done, this conversation is idle and may be dropped too
        asyncio.get_running_loop().call_soon(conv.agent.conversation_idle)

    async def _run_turns(self) -> None:
        conv = self.conv
        while not conv.closed and not conv.agent.stopping:
            if self._reload:
                await self._take_up()
                continue
            record = self.held
            if record is not None:
                if self._holding():
                    break  # it holds the line, with no task, until answered or interrupted
                self.held = None
            elif self.queue:
                record = self.queue.popleft()
                if record.id in self._dropped:  # cancelled through another instance
                    self._dropped.discard(record.id)
                    continue
            else:
                break
            self.taken = record.id
            cancel, self._cancel = record.id == self._cancel, None
            cut = record.id in self._cut
            self._cut.discard(record.id)
            links = self._answer_traces.pop(record.id, ())
            try:
                result = await conv.runner.run(record, cut=cut, cancel=cancel, trace_links=links)
            finally:
                self.taken = None
            if result.state is TurnState.WAITING:
                self.held = self._answered.pop(result.id, result)

    async def _take_up(self) -> None:
        """Take this conversation's open turns as the store has them, between two turns (none
        runs here): its queue in the store's order (deduplicated by id: sends this instance
        took meanwhile come after), the turn at its head that holds the line (answered
        elsewhere, or cut by its last owner's end: then resumed from its last recorded step),
        and a ``UserMessage`` for each send another instance took (this one produces the
        conversation's events)."""
        conv = self.conv
        self._reload = False
        if conv.ownership.inherited(conv.id):  # taken by a send, an answer, an interrupt here
            self._settle = True
        before = {r.id for r in self.queue}
        turns = await conv.store.open_turns(conv.id)
        died = bool(self._settle)  # its last owner ended without handing it over
        if self._settle is not None:  # taken over (by the sweep, or a take here)
            if died and turns and self._may_have_run(turns[0]):
                # its last owner died as it may have run it: what it streamed last is lost
                await conv.log.producer_died(turns[0].id)
            turns = await self._settle_turns(turns, self._settle)
            self._settle = None
        self._sent_here.clear()
        stored = {t.id for t in turns}
        local = {r.id for r in self.queue}
        # sends taken here during the read come after; those that were queued here and are
        # no longer open were cancelled through another instance
        later = [r for r in self.queue if r.id not in before and r.id not in stored]
        queued = [t for t in turns if t.state is TurnState.QUEUED]
        self.queue = deque([*queued, *later])
        self._dropped &= {r.id for r in self.queue}  # the others were read as over
        head = next((t for t in turns if t.state is not TurnState.QUEUED), None)
        if head is not None and head.state is TurnState.RUNNING and not _answered_wait(head):
            self._cut.add(head.id)  # its owner ended while it ran
        self.held = head
        for record in queued:
            if record.id not in local:
                self._announce(record)

    async def _settle_turns(self, turns: list[TurnRecord], unclean: bool) -> list[TurnRecord]:
        """The resume rules (as a restart's, ChatAgent.open) for the turns an owner that is
        gone left: a running one — and after an ``unclean`` end the first queued one, which may
        have started before its first step was stored — resumes unless ``resume_turns`` is off,
        a queued one runs unless ``resume_queued`` is off; the others end with a ``restart``
        Error record."""
        kept, ended = self._resume_rules(turns, unclean)
        for t in ended:
            error = error_record(self.conv.id, t.id, RESTART_ERROR, "restart")
            await self.conv.store.fail_turn(self.conv.id, t.id, error)
        return kept

    def _resume_rules(
        self, turns: list[TurnRecord], unclean: bool
    ) -> tuple[list[TurnRecord], list[TurnRecord]]:
        """The turns the resume rules keep, and those they end (see _settle_turns)."""
        agent = self.conv.agent
        if agent.resume_turns and agent.resume_queued:
            return turns, []
        kept: list[TurnRecord] = []
        ended: list[TurnRecord] = []
        for i, t in enumerate(turns):
            if t.id in self._sent_here:  # sent since, not left by the last owner
                kept.append(t)
                continue
            ran = t.state is TurnState.RUNNING or (i == 0 and unclean)
            resumed = agent.resume_turns if ran else agent.resume_queued
            (kept if t.state is TurnState.WAITING or resumed else ended).append(t)
        return kept, ended

    def _may_have_run(self, turn: TurnRecord) -> bool:
        """Whether an owner that died may have been running ``turn`` (the store's first open
        one): running and not just answered, or queued (a turn is recorded running only at
        its first step) and not sent through this instance since."""
        if turn.state is TurnState.QUEUED:
            return turn.id not in self._sent_here
        return turn.state is TurnState.RUNNING and not _answered_wait(turn)

    def interrupt(self, turn_id: str | None = None) -> bool:
        """Stop the running turn, or end the waiting one; queued sends still run. With
        ``turn_id``, only that turn: nothing when another one runs or waits."""
        if not self.conv.ownership.owns(self.conv.id):
            self.conv.agent.jobs.spawn(
                f"interrupt {self.conv.id}", self.interrupt_anywhere(turn_id)
            )
            return self.conv.busy
        if turn_id in (None, self.taken) and self.conv.runner.interrupt():
            return True
        held = self.held
        if held is None or held.state is not TurnState.WAITING or turn_id not in (None, held.id):
            return False
        self._cancel = held.id
        self.start()
        return True

    async def interrupt_anywhere(self, turn_id: str | None = None) -> bool:
        """:meth:`interrupt`, where another instance may own the conversation: its owner is
        told (the turn named, if any: the owner stops it only if it runs or waits there); a
        waiting turn nobody owns is ended here (this instance takes the lease)."""
        conv = self.conv
        ownership = conv.ownership
        if ownership.owns(conv.id):
            return self.interrupt(turn_id)
        turns = await conv.store.open_turns(conv.id)
        if not turns or turn_id not in (None, *(t.id for t in turns)):
            return False  # (a queued one may have started: its first step is not stored)
        head = turns[0]
        waiting = head.state is TurnState.WAITING and turn_id in (None, head.id)
        if waiting and await ownership.take(conv.id):
            self._cancel = head.id
            self.refresh()
            return True
        ownership.tell(conv.id, "interrupt", turn_id)
        return True

    async def cancel_queued(self, message_id: str) -> bool:
        conv = self.conv
        ownership = conv.ownership
        if not ownership.owns(conv.id):
            turn = await conv.turn(message_id)
            if turn is None or turn.state is not TurnState.QUEUED:
                return False
            if not await ownership.take(conv.id):
                # its owner may have started it (a turn is recorded running only with its
                # first step): the owner says (None: no answer in time, nothing cancelled)
                return bool(await ownership.ask(conv.id, "cancel", message_id))
            # no live owner: this instance runs the conversation's turns from now on
            cancelled = await self._cancel_owned(message_id)
            self.refresh()  # the rest of the store's queue
            return cancelled
        return await self._cancel_owned(message_id)

    async def _cancel_owned(self, message_id: str) -> bool:
        """:meth:`_cancel_here` under this instance's lease: an owner whose lease is over (hung
        past it) cancels nothing, not the turn its successor may be starting (still queued in
        the store), and stops running the conversation."""
        ownership = self.conv.ownership
        try:
            with ownership.fenced(self.conv.id):
                return await self._cancel_here(message_id)
        except LeaseLost:
            ownership.lost(self.conv.id)
            return False

    async def _cancel_here(self, message_id: str) -> bool:
        """Cancel a queued turn of a conversation this instance owns."""
        shared = self.conv.ownership.shared
        error = error_record(self.conv.id, message_id, CANCELLED_ERROR, CANCELLED)
        for record in self.queue:
            if record.id == message_id:
                self.queue.remove(record)  # now, before any await: the worker cannot take it
                if not shared:
                    await self.conv.store.fail_turn(
                        self.conv.id, message_id, error, TurnState.CANCELLED
                    )
                    return True
                # moved only while queued: never a turn another instance started
                if not await self.conv.store.cancel_queued_turn(self.conv.id, message_id, error):
                    return False
                self._cancelled(message_id)
                return True
        if not shared or message_id == self.taken:
            return False
        # stored by another instance, not taken up here yet (its wake is on its way): the
        # store cancels it while it is queued, and the worker skips it if a read of the
        # store under way brings it in
        if not await self.conv.store.cancel_queued_turn(self.conv.id, message_id, error):
            return False
        self._dropped.add(message_id)
        self._cancelled(message_id)
        return True

    def _cancelled(self, turn_id: str) -> None:
        """Where instances share the store, a turn cancelled in the queue ends with its Error
        and End (none of it ran): a reader that follows it on another instance (the one its
        send went through) settles on them, brought there by the event relay. Alone on its
        store, the only reader of a queued turn is the transport that cancels it."""
        events = self.conv.log
        events.publish(Error(CANCELLED_ERROR, CANCELLED), turn_id)
        events.publish(End(turn_id), turn_id)

    async def answer(self, turn_id: str, call_id: str, answer: Any) -> TurnRecord:
        """Give a waiting turn the answer to one of its waits; the turn goes on once every
        wait has its answer. Raises :class:`UnknownReference` for a turn or wait that does not
        exist and :class:`NotWaiting` for one that is not waiting for it."""
        async with self._answering:
            owned = self.conv.ownership.owns(self.conv.id)
            held = self.held if owned and self.held and self.held.id == turn_id else None
            record = (
                held
                or (self._answered.get(turn_id) if owned else None)
                or await self.conv.store.get_turn(turn_id)
            )
            if record is None or record.conversation_id != self.conv.id:
                raise UnknownReference(f"no turn {turn_id!r} in this conversation")
            wait = next((w for w in record.waits if w.call_id == call_id), None)
            if record.state is not TurnState.WAITING:
                raise NotWaiting(f"turn {turn_id} is {record.state}, not waiting")
            if wait is None:
                raise UnknownReference(f"turn {turn_id} waits for no call {call_id!r}")
            if wait.answered:
                raise NotWaiting(f"call {call_id} of turn {turn_id} was already answered")
            records = []
            if wait.kind == APPROVAL:  # checked, and written to the history beside the move
                approval = approvals.check(answer, wait, self.conv.agent.tools)
                answer = approval.to_json()
                records.append(approvals.answer_record(self.conv.id, wait, approval))
            try:  # the turn as stored gets the answer (another instance may answer too)
                record = await self.conv.store.answer_wait(
                    self.conv.id, turn_id, call_id, answer, records
                )
            except TurnStateError as e:  # ended meanwhile (an interrupt), or answered
                raise NotWaiting(str(e)) from None
            state = record.state
            if self.conv.agent.observers:  # in the answering request's task
                trace = self.conv.agent.observers.trace_context()
                if trace is not None:
                    self._answer_traces.setdefault(turn_id, []).append(trace)
            if not owned:  # stored: its owner goes on with it (this instance, if it is free)
                if state is TurnState.RUNNING:
                    self.refresh(nudge=True)
                return record
            if held is not None or (self.held is None and not self.running):
                self.held = record  # a turn of this conversation that waits in the store
            else:
                self._answered[turn_id] = record  # its run is returning: _drain takes it
            if state is TurnState.RUNNING:
                self.start()
            return record


def _answered_wait(turn: TurnRecord) -> bool:
    """A running turn whose waits all have their answers and that nobody went on with yet
    (the instance that takes it up does, as the answers say): no call of it was cut."""
    waits = turn.waits
    return bool(waits) and all(w.answered and not w.taken for w in waits)
