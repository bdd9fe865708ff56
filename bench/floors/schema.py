"""The tables agentik creates (copied from ``sqlite_master`` of an agentik database), so the
floors write exactly the same rows into exactly the same indexes, with the same pragmas."""

from __future__ import annotations

import sqlite3

DDL = """
CREATE TABLE IF NOT EXISTS "conversation" ("id" TEXT NOT NULL PRIMARY KEY, "title" TEXT,
  "created_at" TEXT NOT NULL, "updated_at" TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS "conversation_updated_at" ON "conversation" ("updated_at");
CREATE TABLE IF NOT EXISTS "message" ("seq" INTEGER NOT NULL PRIMARY KEY, "id" TEXT NOT NULL,
  "conversation_id" TEXT NOT NULL, "kind" TEXT NOT NULL, "turn_id" TEXT, "created_at" TEXT NOT NULL,
  "payload_json" TEXT NOT NULL, FOREIGN KEY ("conversation_id") REFERENCES "conversation" ("id")
  ON DELETE CASCADE);
CREATE UNIQUE INDEX IF NOT EXISTS "message_id" ON "message" ("id");
CREATE INDEX IF NOT EXISTS "message_conversation_id" ON "message" ("conversation_id");
CREATE INDEX IF NOT EXISTS "message_turn_id" ON "message" ("turn_id");
CREATE INDEX IF NOT EXISTS "message_conversation_id_seq" ON "message" ("conversation_id", "seq");
CREATE TABLE IF NOT EXISTS "working_memory" ("id" INTEGER NOT NULL PRIMARY KEY,
  "conversation_id" TEXT NOT NULL, "order_idx" INTEGER NOT NULL, "turn_id" TEXT,
  "role" TEXT NOT NULL, "payload_json" TEXT NOT NULL, "created_at" TEXT NOT NULL,
  FOREIGN KEY ("conversation_id") REFERENCES "conversation" ("id") ON DELETE CASCADE);
CREATE INDEX IF NOT EXISTS "working_memory_conversation_id" ON "working_memory" ("conversation_id");
CREATE INDEX IF NOT EXISTS "working_memory_conversation_id_order_idx"
  ON "working_memory" ("conversation_id", "order_idx");
CREATE TABLE IF NOT EXISTS "idempotency_key" ("conversation_id" TEXT NOT NULL,
  "key" TEXT NOT NULL, "message_id" TEXT NOT NULL, PRIMARY KEY ("conversation_id", "key"),
  FOREIGN KEY ("conversation_id") REFERENCES "conversation" ("id") ON DELETE CASCADE);
CREATE TABLE IF NOT EXISTS "agent_state" ("key" TEXT NOT NULL PRIMARY KEY, "value" TEXT NOT NULL);
CREATE TRIGGER IF NOT EXISTS message_append_only BEFORE UPDATE ON message
BEGIN SELECT RAISE(ABORT, 'message is an append-only audit log'); END;
"""

#: the two single-column indexes above duplicate the prefix of a composite one (peewee makes
#: one per ForeignKeyField); the "lean" schema leaves them out to show what they cost
LEAN_SKIP = ('"message_conversation_id" ', '"working_memory_conversation_id" ')

PRAGMAS = (
    "PRAGMA journal_mode=wal",
    "PRAGMA synchronous=normal",
    "PRAGMA foreign_keys=1",
    "PRAGMA cache_size=-16000",
    "PRAGMA busy_timeout=10000",
)


def begin(db: sqlite3.Connection, durable: bool = False) -> None:
    """BEGIN; with ``durable`` the commit that follows fsyncs the WAL (power-loss safe), as
    agentik commits an acknowledged user message: synchronous=FULL for that one transaction."""
    if durable:
        db.execute("PRAGMA synchronous=full")
    db.execute("BEGIN")


def commit(db: sqlite3.Connection, durable: bool = False) -> None:
    db.execute("COMMIT")
    if durable:
        db.execute("PRAGMA synchronous=normal")


def connect(path: str, lean: bool = False) -> sqlite3.Connection:
    """Autocommit mode: the caller writes ``BEGIN`` … ``COMMIT`` itself, like peewee's atomic()."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    for p in PRAGMAS:
        db.execute(p)
    ddl = DDL
    if lean:
        ddl = "\n".join(line for line in DDL.splitlines() if not any(s in line for s in LEAN_SKIP))
    db.executescript(ddl)
    return db
