"""The SQLite store: the default, one file (``AGENTIK_DB_PATH``). SQLite-only SQL stays here;
what every SQL database runs alike is :class:`agentik.core.store.sql.SqlStore`."""

from __future__ import annotations

from typing import cast

import peewee

from agentik.core import models
from agentik.core.db import Database
from agentik.core.store.sql import SqlStore

# the turn table came after the message table: a database from before it gets a turn per user
# message, its state read off its records (an end record, or steps in working memory)
_KEYS_JOIN = "LEFT JOIN idempotency_key k ON k.message_id = u.id"
_BACKFILL_TURNS = f"""
INSERT INTO turn (id, conversation_id, state, step, idempotency_key, created_at, updated_at)
SELECT u.id, u.conversation_id,
  CASE
    WHEN e.kind = 'assistant' AND json_extract(e.payload_json, '$.interrupted') THEN 'cancelled'
    WHEN e.kind = 'assistant' THEN 'done'
    WHEN e.kind = 'error' AND json_extract(e.payload_json, '$.code') = 'cancelled'
      THEN 'cancelled'
    WHEN e.kind = 'error' THEN 'failed'
    WHEN EXISTS (SELECT 1 FROM working_memory w WHERE w.turn_id = u.id) THEN 'running'
    ELSE 'queued'
  END,
  0, k.key, u.created_at, coalesce(e.created_at, u.created_at)
FROM message u
LEFT JOIN message e ON e.seq = (SELECT min(t.seq) FROM message t
  WHERE t.turn_id = u.id AND t.kind IN ('assistant', 'error'))
{_KEYS_JOIN}
WHERE u.kind = 'user'
ORDER BY u.seq
"""


class SqliteStore(SqlStore):
    db: Database

    TOKEN_TOTALS_SQL = (
        "SELECT count(*), coalesce(sum(json_extract(payload_json, '$.tokens.input')), 0),"
        " coalesce(sum(json_extract(payload_json, '$.tokens.output')), 0),"
        " count(*) - count(json_extract(payload_json, '$.tokens.input')) "
        "FROM message WHERE kind = 'assistant'"
    )
    CALL_TURN_SQL = (
        "SELECT turn_id FROM message WHERE conversation_id = ? AND kind = 'tool_call' "
        "AND json_extract(payload_json, '$.callId') = ? ORDER BY seq DESC LIMIT 1"
    )

    def __init__(self, db: Database) -> None:
        self.db = db
        # this store's own class of the table: peewee binds a class to one database
        (usage,) = models.for_agent(models.BackgroundUsage)
        self._usage = cast(type[models.BackgroundUsage], usage)

    async def open(self) -> None:
        await self.db.open(models.MODELS)
        self.db.db.bind([self._usage])
        await self.db.write(lambda: self.db.execute(models.APPEND_ONLY_TRIGGER))
        await self.db.write(self._migrate)

    def _migrate(self) -> None:
        """Bring a database of an earlier agentik up to date (in one transaction)."""
        tables = {
            r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        keys = "idempotency_key" in tables  # the keys moved onto the turns
        if (
            self.db.execute("SELECT 1 FROM turn LIMIT 1").fetchone() is None
            and self.db.execute("SELECT 1 FROM message WHERE kind = 'user' LIMIT 1").fetchone()
        ):
            backfill = _BACKFILL_TURNS
            if not keys:
                backfill = backfill.replace("k.key", "NULL").replace(_KEYS_JOIN, "")
            self.db.execute(backfill)
        if keys:
            self.db.execute("DROP TABLE idempotency_key")

    async def add_models(self, models: list[type[peewee.Model]]) -> Database | None:
        self.db.db.bind(models)
        self.db.db.create_tables(models, safe=True)  # as Database.open does for the core's
        return self.db
