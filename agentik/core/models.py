"""The tables. ``message`` is the append-only audit log (a trigger refuses updates);
``working_memory`` is the mutable LLM context; both cascade with their conversation."""

from __future__ import annotations

import peewee


def for_agent(*models: type[peewee.Model]) -> tuple[type[peewee.Model], ...]:
    """A subclass of each of a plugin's models, on the same table, for one agent: peewee binds a
    model class to one database, and a process may hold several agents (tests, embedders).
    Bind what this returns with ``agent.store.add_models``."""
    return tuple(
        type(
            model.__name__,
            (model,),
            {
                "__module__": model.__module__,
                "Meta": type("Meta", (), {"table_name": model._meta.table_name}),
            },
        )
        for model in models
    )


class BaseModel(peewee.Model):
    class Meta:
        legacy_table_names = False


class Conversation(BaseModel):
    id = peewee.TextField(primary_key=True)
    title = peewee.TextField(null=True)
    created_at = peewee.TextField()
    updated_at = peewee.TextField(index=True)


class Message(BaseModel):
    seq = peewee.AutoField()
    id = peewee.TextField(unique=True)
    conversation = peewee.ForeignKeyField(
        Conversation, column_name="conversation_id", on_delete="CASCADE"
    )
    kind = peewee.TextField()
    # the user message whose turn wrote this record (its own id for a user message)
    turn_id = peewee.TextField(null=True, index=True)
    created_at = peewee.TextField()
    payload_json = peewee.TextField()

    class Meta:
        indexes = ((("conversation", "seq"), False),)


class WorkingMemory(BaseModel):
    id = peewee.AutoField()
    conversation = peewee.ForeignKeyField(
        Conversation, column_name="conversation_id", on_delete="CASCADE"
    )
    order_idx = peewee.IntegerField()
    turn_id = peewee.TextField(null=True)
    role = peewee.TextField()
    payload_json = peewee.TextField()
    created_at = peewee.TextField()

    class Meta:
        table_name = "working_memory"
        indexes = ((("conversation", "order_idx"), False),)


class Turn(BaseModel):
    """A turn as durable state (agentik.core.turns): one per user message, written with it.

    ``seq`` orders a conversation's turns (its FIFO); ``idempotency_key`` is the client's key
    for the send, so a retried send stores nothing twice; ``waits_json`` is what a waiting turn
    waits for."""

    seq = peewee.AutoField()
    id = peewee.TextField(unique=True)  # the user message's id
    conversation = peewee.ForeignKeyField(
        Conversation, column_name="conversation_id", on_delete="CASCADE", index=False
    )
    state = peewee.TextField()
    step = peewee.IntegerField(default=0)
    waits_json = peewee.TextField(null=True)
    idempotency_key = peewee.TextField(null=True)
    created_at = peewee.TextField()
    updated_at = peewee.TextField()

    class Meta:
        indexes = (
            (("conversation", "idempotency_key"), True),  # NULLs (no key) never collide
            (("conversation", "seq"), False),
            (("state", "seq"), False),  # the open turns, at start-up
        )


class ConversationAlias(BaseModel):
    """A name another protocol gives a conversation (an AG-UI thread id, an A2A context id):
    ``namespace`` is the protocol's, ``key`` the client's id."""

    namespace = peewee.TextField()
    key = peewee.TextField()
    conversation = peewee.ForeignKeyField(
        Conversation, column_name="conversation_id", on_delete="CASCADE"
    )

    class Meta:
        table_name = "conversation_alias"
        primary_key = peewee.CompositeKey("namespace", "key")


class AgentState(BaseModel):
    """Small facts about the agent itself, e.g. whether its last stop was clean."""

    key = peewee.TextField(primary_key=True)
    value = peewee.TextField()

    class Meta:
        table_name = "agent_state"


class BackgroundUsage(BaseModel):
    """The token counts of one model call the agent made for itself (memory review, reflection,
    skill mining, a compaction's summary): not part of any turn's counts. ``conversation_id``
    is not a foreign key: the counts stay when their conversation is deleted."""

    id = peewee.AutoField()
    feature = peewee.TextField()
    conversation_id = peewee.TextField(null=True)
    created_at = peewee.TextField()
    input_tokens = peewee.IntegerField()
    output_tokens = peewee.IntegerField()
    estimated = peewee.BooleanField(default=False)  # the server sent no counts

    class Meta:
        table_name = "background_usage"


class Instance(BaseModel):
    """A running agentik process on a shared database (PostgreSQL): alive while ``expires_at``,
    the database server's time, is ahead; its heartbeat moves it (one statement a beat)."""

    id = peewee.TextField(primary_key=True)
    expires_at = peewee.DateTimeField()

    class Meta:
        table_name = "agentik_instance"


class ConversationLease(BaseModel):
    """Which instance owns a conversation (runs its turns), and the lease's epoch: it grows
    each time another instance takes the conversation over, and every write of a turn names
    the epoch it was started under (a fencing token: a stale owner's write is refused)."""

    conversation = peewee.ForeignKeyField(
        Conversation, column_name="conversation_id", primary_key=True, on_delete="CASCADE"
    )
    owner = peewee.TextField()
    epoch = peewee.BigIntegerField()

    class Meta:
        table_name = "conversation_lease"


class TemporaryConversation(BaseModel):
    """A temporary conversation (``temp``), where instances share the database: it is stored
    like the others, so that every instance serves it, but it is listed, counted and summed
    nowhere, and it ends (deleted) when its owner lets it go idle, or when its owner is gone
    (agentik.core.ownership). Alone on its database an agent keeps them in memory only."""

    conversation = peewee.ForeignKeyField(
        Conversation, column_name="conversation_id", primary_key=True, on_delete="CASCADE"
    )

    class Meta:
        table_name = "temporary_conversation"


#: the tables of many instances on one database (the PostgreSQL store's)
OWNERSHIP_MODELS: list[type[peewee.Model]] = [Instance, ConversationLease, TemporaryConversation]

MODELS: list[type[peewee.Model]] = [
    Conversation,
    Message,
    WorkingMemory,
    Turn,
    ConversationAlias,
    AgentState,
    BackgroundUsage,
]

APPEND_ONLY_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS message_append_only BEFORE UPDATE ON message
BEGIN SELECT RAISE(ABORT, 'message is an append-only audit log'); END
"""
