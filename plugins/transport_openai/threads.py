"""Which conversation an OpenAI-style request continues, kept in two tables (peewee, portable
SQL; both cascade with their conversation). ``docs/openai_api.md`` explains the rules.

- ``openai_thread_next``: the digest of the transcript a client sends back to continue a
  conversation (its messages so far, as the client has them). A request whose earlier messages
  have that digest continues it; taking it is one transaction, so two requests with the same
  history never both continue the same conversation.
- ``openai_thread_sent``: per conversation, the last request sent to it (the digest of its earlier
  messages and the new one, the user message it became) and the client's system text last given
  as message context. The same request again is a retry: it gets that turn's reply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import peewee

from agentik.core import models
from agentik.core.models import for_agent
from agentik.core.store import utcnow
from agentik_transport_openai.request import chain, normalise

if TYPE_CHECKING:
    from agentik.core.db import Database
    from agentik.core.types import Message


class ThreadNext(peewee.Model):
    digest = peewee.TextField(index=True)
    conversation = peewee.ForeignKeyField(
        models.Conversation, column_name="conversation_id", on_delete="CASCADE", index=True
    )
    created_at = peewee.TextField()

    class Meta:
        table_name = "openai_thread_next"


class ThreadSent(peewee.Model):
    conversation = peewee.ForeignKeyField(
        models.Conversation, column_name="conversation_id", on_delete="CASCADE", primary_key=True
    )
    #: the request's digest (earlier messages and the new one); empty: a retry runs it again
    digest = peewee.TextField(index=True)
    prior = peewee.TextField()  # the digest of its earlier messages
    turn_id = peewee.TextField()  # the user message it became
    system = peewee.TextField(null=True)  # the digest of the system text last given
    #: a request took the conversation and has not recorded its send yet
    taken = peewee.BooleanField(default=False)

    class Meta:
        table_name = "openai_thread_sent"


def thread_models() -> tuple[type[ThreadNext], type[ThreadSent]]:
    """This agent's subclasses of the two tables (:func:`agentik.core.models.for_agent`)."""
    return cast(tuple[type[ThreadNext], type[ThreadSent]], for_agent(ThreadNext, ThreadSent))


@dataclass(frozen=True, slots=True)
class Sent:
    conversation_id: str
    digest: str
    prior: str
    turn_id: str
    system: str | None


@dataclass(frozen=True, slots=True)
class Claim:
    """A conversation taken by a request: what was last sent to it (None: nothing through this
    door yet) and the digests that continued it (given back if the request sends nothing)."""

    conversation_id: str
    last: Sent | None
    digests: list[str]


class ThreadStore:
    def __init__(
        self, db: Database, next_model: type[ThreadNext], sent_model: type[ThreadSent]
    ) -> None:
        self.db, self.next, self.sent = db, next_model, sent_model

    async def claim(self, digest: str) -> Claim | None:
        """Take the conversation that a transcript with ``digest`` continues (the most recent
        when several have the same), so that no other request continues it until this one's
        turn is settled; None when no conversation has it."""
        n = self.next

        def take() -> Claim | None:
            row = (
                n.select(n.conversation)
                .where(n.digest == digest)
                .order_by(n.created_at.desc(), n.id.desc())
                .first()
            )
            return None if row is None else self._take(row.conversation_id)

        return await self.db.write(take)

    async def take(self, conversation_id: str) -> Claim:
        """Take a conversation the client named (its header) the same way."""
        return await self.db.write(lambda: self._take(conversation_id))

    async def take_if(self, conversation_id: str, turn_id: str) -> Claim | None:
        """Take a conversation whose last send is still ``turn_id`` and that no other request has
        taken; None otherwise."""
        s = self.sent

        def take() -> Claim | None:
            row = s.get_or_none(s.conversation == conversation_id)
            if row is None or row.turn_id != turn_id or row.taken:
                return None
            return self._take(conversation_id)

        return await self.db.write(take)

    def _take(self, conversation_id: str) -> Claim:
        n, s = self.next, self.sent
        taken = n.select(n.digest).where(n.conversation == conversation_id)
        digests = [row.digest for row in taken]
        n.delete().where(n.conversation == conversation_id).execute()
        last = self._sent(s.get_or_none(s.conversation == conversation_id))
        s.update(taken=True).where(s.conversation == conversation_id).execute()
        return Claim(conversation_id, last, digests)

    async def release(self, claim: Claim) -> None:
        """Give back a conversation taken by a request that sent nothing (it was refused)."""
        n, s = self.next, self.sent
        now = utcnow().isoformat()
        rows = [
            {"digest": d, "conversation": claim.conversation_id, "created_at": now}
            for d in claim.digests
        ]

        def write() -> None:
            if rows:
                n.insert_many(rows).execute()
            s.update(taken=False).where(s.conversation == claim.conversation_id).execute()

        await self.db.write(write)

    async def retry_of(self, digest: str) -> Sent | None:
        """The last send of a request with this digest (the same request again), or None."""
        if not digest:
            return None
        s = self.sent
        # several only for word-for-word identical conversations: any of them will do
        row = await self.db.read(lambda: s.select().where((s.digest == digest) & ~s.taken).first())
        return self._sent(row)

    async def record(self, sent: Sent) -> None:
        """What was just sent to a conversation (replacing what was sent before)."""
        s = self.sent
        row = {
            "conversation": sent.conversation_id,
            "digest": sent.digest,
            "prior": sent.prior,
            "turn_id": sent.turn_id,
            "system": sent.system,
        }

        def write() -> None:  # delete + insert: portable, unlike REPLACE
            s.delete().where(s.conversation == sent.conversation_id).execute()
            s.insert(**row).execute()

        await self.db.write(write)

    async def settle(self, sent: Sent, end: Message) -> None:
        """The turn of ``sent`` ended with the record ``end``: the digests that continue its
        conversation now."""
        n, s = self.next, self.sent
        if end.kind == "assistant":
            digests = [chain(sent.digest, [("assistant", normalise(end.payload.get("text", "")))])]
        else:
            # no reply: the client may keep its failed message or drop it; the same request
            # again runs it again (a failure is no answer to give back)
            digests = [sent.prior, sent.digest]
        now = utcnow().isoformat()

        def write() -> None:
            n.delete().where(n.conversation == sent.conversation_id).execute()
            rows = [
                {"digest": d, "conversation": sent.conversation_id, "created_at": now}
                for d in dict.fromkeys(digests)
                if d
            ]
            if rows:
                n.insert_many(rows).execute()
            mine = (s.conversation == sent.conversation_id) & (s.turn_id == sent.turn_id)
            # a take that a stop cut off before its send is undone with it
            s.update(taken=False).where(mine).execute()
            if end.kind != "assistant":
                s.update(digest="").where(mine).execute()

        await self.db.write(write)

    async def unsettled(self) -> list[Sent]:
        """The conversations taken by a request whose turn was not settled (a stop came first)."""
        n, s = self.next, self.sent
        rows = await self.db.read(
            lambda: list(
                s.select().where(
                    ~peewee.fn.EXISTS(n.select(n.id).where(n.conversation == s.conversation))
                )
            )
        )
        return [self._sent(r) for r in rows if r is not None]  # type: ignore[misc]

    @staticmethod
    def _sent(row: Any) -> Sent | None:
        if row is None:
            return None
        return Sent(row.conversation_id, row.digest, row.prior, row.turn_id, row.system)
