"""Which instance runs a conversation's turns.

Alone on its store (SQLite, the default) an agent owns every conversation: :class:`Ownership`
says so and does nothing else. Several instances on one PostgreSQL (issue 26) share the work
through :class:`SharedOwnership`: a conversation's turns run only on the instance that holds
its lease (kept while the conversation is live in that instance's memory), under a fence
(a write of a stale owner is refused); the instance beats every ``ttl / 3``; a sweeper takes
up conversations with turns to run whose owner is gone; a temporary conversation is stored
too, owned from the start by the instance that made it, which deletes it when it lets it go
idle (a job of one instance at a time deletes those whose owner is gone); and instances
tell each other what changed through the store's notifications: ``wake`` (payload: a
conversation id; its owner takes up what the store holds: sends and answers another instance
stored, a released lease) and ``control`` (JSON ``{"conversation", "op"}``: ``interrupt``,
with the ``turn`` it stops if one is named, ``forget``, ``rename``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

import peewee

from agentik.core.store.base import Lease, SharedStore, Store
from agentik.core.types import ConversationInfo

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent
    from agentik.core.conversation import ChatConversation

log = logging.getLogger(__name__)

WAKE = "wake"
CONTROL = "control"
#: seconds an instance waits for the answer of a conversation's owner (ask)
ASK_TIMEOUT = 5.0


class Ownership:
    """One instance alone on its store: it owns every conversation, and there is nobody to
    tell anything."""

    shared = False

    def owns(self, conversation_id: str) -> bool:
        return True

    async def take(self, conversation_id: str) -> bool:
        return True

    async def create(self, store: Store, info: ConversationInfo) -> None:
        """Store a new conversation."""
        await store.create_conversation(info)

    def fenced(self, conversation_id: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def unfenced(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def release(self, conversation_id: str) -> None:
        """The conversation left this instance's memory (evicted idle)."""

    def lost(self, conversation_id: str) -> None:
        """Another instance took the conversation over (a write was refused)."""

    async def end_temporary(self, store: Store, conversation_id: str) -> bool:
        """A temporary conversation this instance let go idle ends: deleted (True), unless a
        turn came to run in it meanwhile."""
        return await store.delete_conversation(conversation_id)

    def inherited(self, conversation_id: str) -> bool:
        """Once, after :meth:`take`: whether it took the conversation from an owner that
        never gave it up (died, or hung past its heartbeat): what that one left is settled as
        after a crash."""
        return False

    def forget(self, conversation_id: str) -> None:
        """The conversation was deleted through this instance."""

    def wake(self, conversation_id: str) -> None:
        """Tell the conversation's owner the store holds something new for it."""

    def tell(self, conversation_id: str, op: str, turn_id: str | None = None) -> None:
        """Tell every instance about a conversation (``control``), or one of its turns."""

    async def ask(self, conversation_id: str, op: str, turn_id: str) -> bool | None:
        """Ask the conversation's owner to do ``op`` (``cancel``) to one of its turns: what it
        answered, or None when no answer came in time."""
        return None

    async def open(self) -> None:
        pass

    async def start(self) -> int:
        return 0

    async def elsewhere(self, conversation_id: str) -> bool:
        """Whether another live instance runs the conversation's turns now (holds its
        lease)."""
        return False

    async def others_alive(self) -> bool:
        """Whether other instances share the store now (a stop hands its turns to them)."""
        return False

    async def hand_off(self) -> None:
        pass

    async def close(self) -> None:
        pass


class SharedOwnership(Ownership):
    """Many instances on one store (PostgreSQL): leases, heartbeat, sweeper, notifications."""

    shared = True

    def __init__(self, agent: ChatAgent, store: SharedStore, ttl: float) -> None:
        self.agent = agent
        self.store = store
        self.ttl = ttl
        self.instance = agent.instance_id
        #: the conversations this instance owns (each live in its memory)
        self.leases: dict[str, Lease] = {}
        self._sweeping: asyncio.Task[Any] | None = None
        self._sweep_again = False
        #: sweeps wait for start() (the tools, memory and services up) ...
        self._started = False
        #: ... and, after this instance's connection to the server was lost, for every instance
        #: to beat (and lock) again: until then a live one looks gone (time.monotonic())
        self._quiet_until = 0.0
        #: questions asked to owners (ask), by their key, until answered
        self._asked: dict[str, asyncio.Future[bool]] = {}
        #: the beats share one connection: one at a time
        self._beat_lock = asyncio.Lock()
        #: conversations taken from an owner that never gave them up, not settled yet
        self._inherited: set[str] = set()

    def owns(self, conversation_id: str) -> bool:
        return conversation_id in self.leases

    async def end_temporary(self, store: Store, conversation_id: str) -> bool:
        lease = self.leases.pop(conversation_id, None)
        if lease is None:  # taken over meanwhile: it lives on there
            return False
        return await self.store.end_temporary(lease)

    def inherited(self, conversation_id: str) -> bool:
        if conversation_id not in self._inherited:
            return False
        self._inherited.discard(conversation_id)
        return conversation_id in self.leases

    async def take(self, conversation_id: str) -> bool:
        """The conversation's lease for this instance: kept, or taken when it is free or its
        owner is gone; False while another live instance holds it (or it was deleted)."""
        if conversation_id in self.leases:
            return True
        try:
            # (while quiet every live instance looks gone by its lock: by its heartbeat only)
            by_lock = time.monotonic() >= self._quiet_until
            lease = await self.store.acquire(conversation_id, self.instance, by_lock=by_lock)
        except peewee.IntegrityError:  # the conversation was deleted meanwhile
            return False
        if lease is None:
            return False
        conv = self.agent.live_conversation(conversation_id)
        if conv is not None:  # its events' ids go on above every id the last owner gave
            await self.agent.produce_events(conv)
        # owned from now on: not before its new ids (a send taken meanwhile would go the
        # owner's way with ids of the last owner's range)
        self.leases[conversation_id] = lease
        if lease.inherited:
            self._inherited.add(conversation_id)
        return True

    async def create(self, store: Store, info: ConversationInfo) -> None:
        """A temporary conversation is this instance's from the start: stored with its lease,
        in one transaction (_end_temporaries never finds it without an owner), so this
        instance ends it when it lets it go idle (ChatConversation.evict)."""
        if not info.is_temporal:
            await store.create_conversation(info)
            return
        self.leases[info.id] = await self.store.create_owned(info, self.instance)

    def fenced(self, conversation_id: str) -> contextlib.AbstractContextManager[None]:
        return self.store.fenced(self.leases.get(conversation_id))

    def unfenced(self) -> contextlib.AbstractContextManager[None]:
        return self.store.fenced(None)

    def release(self, conversation_id: str) -> None:
        lease = self.leases.pop(conversation_id, None)
        if lease is not None:
            # not under the fence of the turn that evicted it (that of another conversation);
            # if it fails, this instance's sweep finds the lease still its own
            with self.unfenced():
                self.agent.jobs.spawn(f"release {conversation_id}", self.store.release(lease))

    def lost(self, conversation_id: str) -> None:
        log.warning(
            "conversation %s was taken over by another instance: this one stops running it",
            conversation_id,
        )
        self.leases.pop(conversation_id, None)
        self.agent.drop(conversation_id)
        self.wake(conversation_id)  # what this one took meanwhile is the new owner's

    def forget(self, conversation_id: str) -> None:
        self.leases.pop(conversation_id, None)  # the lease went with the conversation
        self.tell(conversation_id, "forget")

    def wake(self, conversation_id: str) -> None:
        self.agent.jobs.spawn(f"wake {conversation_id}", self.store.notify(WAKE, conversation_id))

    def tell(self, conversation_id: str, op: str, turn_id: str | None = None) -> None:
        message = {"conversation": conversation_id, "op": op}
        if turn_id is not None:
            message["turn"] = turn_id
        payload = json.dumps(message)
        self.agent.jobs.spawn(f"{op} {conversation_id}", self.store.notify(CONTROL, payload))

    async def ask(self, conversation_id: str, op: str, turn_id: str) -> bool | None:
        key = secrets.token_hex(8)
        answer = self._asked[key] = asyncio.get_running_loop().create_future()
        question = {"conversation": conversation_id, "op": op, "turn": turn_id, "ask": key,
                    "from": self.instance}  # fmt: skip
        try:
            await self.store.notify(CONTROL, json.dumps(question))
            return await asyncio.wait_for(answer, ASK_TIMEOUT)
        except TimeoutError:
            log.warning("no answer from the owner of %s to %s %s", conversation_id, op, turn_id)
            return None
        finally:
            self._asked.pop(key, None)

    async def _answer(self, conv: ChatConversation, question: dict[str, Any]) -> None:
        """An owner's answer to :meth:`ask` (``cancel``: whether the turn was still queued
        here; one this instance started is not cancelled). The cancel is fenced by the lease
        (Inbox.cancel_queued): an owner hung past it cancels nothing and answers no."""
        # owned no more (lost or released meanwhile): the owner now answers, not this one
        ok = self.owns(conv.id) and await conv.inbox.cancel_queued(str(question["turn"]))
        answer = {"conversation": conv.id, "op": "answer", "ask": question["ask"],
                  "to": question["from"], "ok": ok}  # fmt: skip
        await self.store.notify(CONTROL, json.dumps(answer))

    # --- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> None:
        """Beat (this instance is alive from now on, every third of the lease's time to live,
        also while the rest starts), and listen."""
        await self.store.heartbeat(self.instance, self.ttl)
        self.agent.jobs.every("heartbeat", self.ttl / 3, self._beat)
        jobs = self.agent.jobs
        jobs.every("temporary conversations", self.ttl, self._end_temporaries, one_instance=True)
        await self.store.listen(WAKE, self._woken, self._missed)
        await self.store.listen(CONTROL, self._control)

    async def start(self) -> int:
        """Take up what no live instance runs (called once the tools, memory and services are
        up: no turn runs here before), then sweep at every beat; returns how many turns."""
        self._started = True
        return await self.sweep()

    async def _beat(self) -> None:
        await self._heartbeat()
        self._sweep_soon()

    async def _heartbeat(self) -> None:
        """One beat at a time (they share one connection); one that took this instance's lock
        again makes it quiet."""
        async with self._beat_lock:
            if await self.store.heartbeat(self.instance, self.ttl):
                self._lost_connection()

    def _lost_connection(self) -> None:
        """This instance's lock was taken again: its connection had been lost, maybe with a
        restart of the server, which freed every instance's lock until its next beat. No sweep
        until the others have beaten too, or it would take their conversations."""
        self._quiet_until = time.monotonic() + self.ttl / 3 + 0.5

    async def sweep(self) -> int:
        """Every conversation with turns to run (queued, or running: answered, or cut by its
        owner's end) whose lease is free or whose owner is gone: this instance takes it (the
        first instance to acquire its lease runs it) and runs its turns, the running one from
        its last recorded step. And those whose lease is this instance's while no worker of
        theirs runs here: the news of them was lost (a notification is sent at most once, and
        not at all by an instance killed after it stored a send), or their lease was left
        behind (a release that failed): they are taken up from the store; not while a turn of
        theirs waits (what is queued behind it runs after its answer, which takes it up)."""
        count = 0
        for conversation_id in list(self.leases):  # a worker a database error stopped (no query)
            live = self.agent.live_conversation(conversation_id)
            if live is not None and live.inbox.stalled:
                live.inbox.refresh()
        for conversation_id, mine in await self.store.orphaned(self.instance):
            if self.agent.stopping:
                break
            try:
                count += await self._sweep_one(conversation_id, mine)
            except Exception as e:  # the next sweep tries again; the others go on
                log.warning("could not take %s up: %s", conversation_id, e)
        return count

    async def _sweep_one(self, conversation_id: str, mine: bool) -> int:
        live = self.agent.live_conversation(conversation_id)
        if mine and live is not None and self.owns(conversation_id):
            inbox = live.inbox
            if not inbox.running and not inbox.sending:  # (a send under way takes them up)
                inbox.refresh()
            return 0
        conv = await self.agent.get_conversation(conversation_id)
        if conv is None or conv.closed:
            return 0
        if conv.inbox.running:  # its worker is taking the lease already
            conv.inbox.refresh()
            return 0
        if not await self.take(conversation_id):
            return 0  # another instance was first
        return await conv.inbox.take_over(unclean=self.inherited(conversation_id))

    async def _end_temporaries(self) -> None:
        """The temporary conversations no live instance owns end (their creator was killed, or
        stopped: nobody is left to let them go idle): deleted, as through this instance. It
        beats first and does nothing while quiet, as a sweep (after a lost connection every
        instance looks gone until it beats again)."""
        await self._heartbeat()
        if time.monotonic() < self._quiet_until:
            return
        for conversation_id in await self.store.end_temporaries():
            self.agent.deleted(conversation_id)

    def _sweep_soon(self) -> None:
        """A sweep in the background, one at a time (a request for one while one runs makes
        it run once more); none before start() or while quiet (a later beat sweeps)."""
        if not self._started or time.monotonic() < self._quiet_until:
            return
        if self._sweeping is not None and not self._sweeping.done():
            self._sweep_again = True
            return

        async def sweeps() -> None:
            self._sweep_again = True
            while self._sweep_again and not self.agent.stopping:
                self._sweep_again = False
                await self.sweep()

        self._sweeping = self.agent.jobs.spawn("sweep", sweeps())

    def _woken(self, conversation_id: str) -> None:
        conv = self.agent.live_conversation(conversation_id)
        if conv is not None and self.owns(conversation_id):
            conv.inbox.refresh()
        else:  # a lease released, or news for an owner that is gone: whoever sweeps first
            self._sweep_soon()

    def _missed(self) -> None:
        """The notifications were cut (the server restarted): beat at once (take the lock
        again), take up what this instance owns, and sweep once every instance beat again."""
        self._lost_connection()
        for conversation_id in list(self.leases):
            self._woken(conversation_id)
        self.agent.jobs.spawn("catching up", self._catch_up())

    async def _catch_up(self) -> None:
        with contextlib.suppress(Exception):  # the next beat tries again
            await self._heartbeat()
        await asyncio.sleep(max(0.0, self._quiet_until - time.monotonic()))
        self._sweep_soon()

    def _control(self, payload: str) -> None:
        try:
            data = json.loads(payload)
            conversation_id, op = str(data["conversation"]), str(data["op"])
        except (ValueError, KeyError, TypeError):
            log.warning("a control notification that is not ours: %r", payload[:200])
            return
        if op == "answer":
            if data.get("to") == self.instance:
                asked = self._asked.get(str(data.get("ask")))
                if asked is not None and not asked.done():
                    asked.set_result(bool(data.get("ok")))
            return
        conv = self.agent.live_conversation(conversation_id)
        if conv is None:
            return
        if op == "interrupt" and self.owns(conversation_id):
            turn = data.get("turn")  # the turn to stop: not another one that runs now
            conv.interrupt(None if turn is None else str(turn))
        elif op == "cancel" and self.owns(conversation_id):
            self.agent.jobs.spawn(f"cancel {conversation_id}", self._answer(conv, data))
        elif op == "forget":
            self.leases.pop(conversation_id, None)
            self.agent.drop(conversation_id, deleted=True)
        elif op == "rename":
            self.agent.jobs.spawn(f"rename {conversation_id}", conv.reload_info())

    async def elsewhere(self, conversation_id: str) -> bool:
        if conversation_id in self.leases:
            return False
        return await self.store.held_elsewhere(conversation_id, self.instance)

    async def others_alive(self) -> bool:
        try:
            return await self.store.others_alive(self.instance) > 0
        except Exception as e:  # the server is away: nobody to hand anything to now
            log.warning("could not see the other instances: %s", e)
            return False

    async def hand_off(self) -> None:
        """A stop: the running turns were cut as a crash would cut them; every lease goes,
        and the other instances are told, so one of them resumes each turn from its last
        recorded step."""
        leases, self.leases = list(self.leases.values()), {}
        if leases and self.agent.shared_events is not None:
            # their last events reach the table before another instance produces more with
            # higher ids (a row that came after those would be dropped as a repeat)
            with contextlib.suppress(Exception):
                await self.agent.shared_events.flush()
        for lease in leases:
            try:
                await self.store.release(lease)
                await self.store.notify(WAKE, lease.conversation_id)
            except Exception as e:  # their heartbeat expiry hands them over then
                log.warning("could not hand %s over: %s", lease.conversation_id, e)

    async def close(self) -> None:
        await self.hand_off()
