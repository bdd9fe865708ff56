"""Durable A2A tasks: one ``a2a_task`` row a task, the whole Task (status, history, artifacts,
metadata) as its A2A 1.0 JSON, beside the columns lists filter on. Portable SQL only (peewee).

Loaded at start-up without a2a-sdk (its protobuf types take a while to import): they are
imported at the first A2A call, or at start-up when a stop left tasks unfinished."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import peewee

from agentik.core.models import for_agent
from agentik.core.store import Store, utcnow

if TYPE_CHECKING:
    from a2a.types import a2a_pb2 as pb

    from agentik.core.agent import ChatAgent
    from agentik.core.db import Database
    from agentik_transport_a2a.service import A2AService

#: the terminal states (as stored)
TERMINAL_NAMES = frozenset(
    {"TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_REJECTED"}
)


class A2ATask(peewee.Model):
    seq = peewee.AutoField()
    id = peewee.TextField(unique=True)
    context_id = peewee.TextField(index=True)
    conversation_id = peewee.TextField()
    turn_id = peewee.TextField(index=True)  # the user message the task's turn answers
    state = peewee.TextField(index=True)  # TASK_STATE_*
    task_json = peewee.TextField()
    created_at = peewee.TextField()
    updated_at = peewee.TextField()

    class Meta:
        table_name = "a2a_task"


TASK_COLUMNS = ("id", "context_id", "conversation_id", "turn_id", "state", "task_json",
                "created_at", "updated_at")  # fmt: skip


class A2ATaskStatus(peewee.Model):
    """Each status a task was given and stored, in order (its status history)."""

    seq = peewee.AutoField()
    task_id = peewee.TextField(index=True)
    state = peewee.TextField()
    status_json = peewee.TextField()  # the TaskStatus: state, timestamp, message

    class Meta:
        table_name = "a2a_task_status"


def task_models() -> tuple[type[A2ATask], type[A2ATaskStatus]]:
    """This agent's subclasses of the two tables (:func:`agentik.core.models.for_agent`)."""
    return cast(tuple[type[A2ATask], type[A2ATaskStatus]], for_agent(A2ATask, A2ATaskStatus))


class Prepared:
    """One statement's SQL as peewee builds it for its model's database, built once and run
    again with new values: building a query is ~0.3 ms of CPU, and a task is written twice a
    turn. ``query`` is made with :func:`marks` for its values."""

    def __init__(self, query: Any) -> None:
        self.database = query.model._meta.database
        self.sql, params = query.sql()
        self.keys = [mark[1:] for mark in params]

    def run(self, values: Mapping[str, str]) -> int:
        """Rows it changed."""
        return int(self.database.execute_sql(self.sql, [values[k] for k in self.keys]).rowcount)


def marks(*keys: str) -> dict[str, str]:
    """Each key's stand-in value: \\0 and the key (found again in the built query's params)."""
    return {k: "\0" + k for k in keys}


class StoredTask:
    __slots__ = ("conversation_id", "task", "turn_id")

    def __init__(self, task: pb.Task, conversation_id: str, turn_id: str) -> None:
        self.task, self.conversation_id, self.turn_id = task, conversation_id, turn_id


def _parse(row: Any) -> StoredTask:
    from a2a.types import a2a_pb2
    from google.protobuf.json_format import ParseDict

    task = ParseDict(json.loads(row.task_json), a2a_pb2.Task(), ignore_unknown_fields=True)
    return StoredTask(task, row.conversation_id, row.turn_id)


def _dump(task: pb.Task) -> str:
    from google.protobuf.json_format import MessageToDict

    return json.dumps(MessageToDict(task), ensure_ascii=False, separators=(",", ":"))


def status_row(task: pb.Task) -> dict[str, str]:
    from google.protobuf.json_format import MessageToDict

    return {
        "task_id": task.id,
        "state": _state(task.status.state),
        "status_json": json.dumps(
            MessageToDict(task.status), ensure_ascii=False, separators=(",", ":")
        ),
    }


def _state(value: int) -> str:
    from a2a.types import a2a_pb2

    return a2a_pb2.TaskState.Name(value)  # type: ignore[arg-type]


class Tasks:
    """The A2A tasks of one agent (``agent.state``): the store from the start, the service
    (with a2a-sdk) from its first use."""

    def __init__(self, agent: ChatAgent, store: TaskStore) -> None:
        self.agent, self.store = agent, store
        self._service: A2AService | None = None

    def service(self) -> A2AService:
        if self._service is None:
            from agentik_transport_a2a.service import A2AService

            self._service = A2AService(self.agent, self.store)
        return self._service

    async def start(self) -> None:
        """Settle what the last stop left unfinished (loading a2a-sdk only if there is any)."""
        if await self.store.has_unfinished():
            await self.service().recover()

    async def settle_orphans(self, grace: float) -> int:
        """:meth:`A2AService.settle_ended` (loading a2a-sdk only if a task is unfinished)."""
        if not await self.store.has_unfinished():
            return 0
        return await self.service().settle_ended(grace)

    async def close(self) -> None:
        if self._service is not None:
            await self._service.close()


class TaskStore:
    """Each write of a task also appends its status to its history, in one transaction."""

    def __init__(
        self,
        db: Database,
        model: type[A2ATask],
        statuses: type[A2ATaskStatus],
        core: Store,
    ) -> None:
        self.core = core  # the agent's store: how its turns ended
        self.db, self.model, self.statuses = db, model, statuses

    @functools.cached_property
    def _insert_task(self) -> Prepared:
        return Prepared(self.model.insert(**marks(*TASK_COLUMNS)))

    @functools.cached_property
    def _update_task(self) -> Prepared:
        m = self.model
        return Prepared(m.update(**marks("state", "task_json", "updated_at")).where(m.id == "\0id"))

    @functools.cached_property
    def _insert_status(self) -> Prepared:
        return Prepared(self.statuses.insert(**marks("task_id", "state", "status_json")))

    async def insert(self, task: pb.Task, conversation_id: str, turn_id: str) -> None:
        now = utcnow().isoformat()
        row = {
            "id": task.id,
            "context_id": task.context_id,
            "conversation_id": conversation_id,
            "turn_id": turn_id,
            "state": _state(task.status.state),
            "task_json": _dump(task),
            "created_at": now,
            "updated_at": now,
        }
        status = status_row(task)
        insert_task, insert_status = self._insert_task, self._insert_status

        def write() -> None:
            insert_task.run(row)
            insert_status.run(status)

        # committed before its id reaches the client (safe against a crash), and not waiting
        # for an fsync of its own: the message it answers is already on disk, and a task a
        # power loss takes is settled again from it (a resent message finds its turn's task
        # or gets a new one); the next durable write's fsync takes it to disk
        await self.db.write(write)

    async def save(
        self, task: pb.Task, earlier: Sequence[dict[str, str]] = (), *, durable: bool = True
    ) -> None:
        """Write the task, after the ``earlier`` statuses it went through in memory only
        (:func:`status_row`), into its status history. ``durable=False``: committed without
        waiting for an fsync of its own (an end that :meth:`A2AService.recover` settles again
        from the audit log)."""
        values = {
            "id": task.id,
            "state": _state(task.status.state),
            "task_json": _dump(task),
            "updated_at": utcnow().isoformat(),
        }
        statuses = [*earlier, status_row(task)]
        update_task, insert_status = self._update_task, self._insert_status

        def write() -> None:
            if update_task.run(values):  # a task that was never stored has no history either
                for status in statuses:
                    insert_status.run(status)

        await self.db.write(write, durable=durable)

    async def get(self, task_id: str) -> StoredTask | None:
        m = self.model
        row = await self.db.read(lambda: m.get_or_none(m.id == task_id))
        return None if row is None else _parse(row)

    async def by_turn(self, turn_id: str) -> StoredTask | None:
        """The task whose turn answers the user message ``turn_id``."""
        m = self.model
        row = await self.db.read(lambda: m.get_or_none(m.turn_id == turn_id))
        return None if row is None else _parse(row)

    async def page(
        self,
        context_id: str = "",
        state: int = 0,
        updated_after: str = "",
        offset: int = 0,
        limit: int = 50,
        live: Mapping[str, int] | None = None,
    ) -> tuple[list[pb.Task], int]:
        """Tasks most recently updated first, and how many match in all. ``live``: the state
        of running tasks by id, where it is newer than the stored one (``WORKING`` is kept in
        memory only)."""
        m = self.model
        query = m.select()
        if context_id:
            query = query.where(m.context_id == context_id)
        if state:
            live = live or {}
            now = [i for i, s in live.items() if s == state]
            moved = [i for i, s in live.items() if s != state]
            query = query.where(((m.state == _state(state)) & m.id.not_in(moved)) | m.id.in_(now))
        if updated_after:
            query = query.where(m.updated_at >= updated_after)

        def run() -> tuple[list[pb.Task], int]:
            rows = query.order_by(m.updated_at.desc(), m.seq.desc()).offset(offset).limit(limit)
            return [_parse(r).task for r in rows], query.count()

        return await self.db.read(run)

    async def unfinished(self) -> list[StoredTask]:
        m = self.model
        rows = await self.db.read(lambda: list(m.select().where(m.state.not_in(TERMINAL_NAMES))))
        return [_parse(r) for r in rows]

    async def has_unfinished(self) -> bool:
        m = self.model
        return await self.db.read(lambda: m.select().where(m.state.not_in(TERMINAL_NAMES)).exists())

    async def turn_end(self, turn_id: str) -> tuple[str, dict[str, Any]] | None:
        """How the core recorded the end of a turn: (``assistant`` | ``error``, payload), or
        None while it has not ended (the audit log is the truth after a restart)."""
        end = await self.core.turn_end(turn_id)
        return None if end is None else (end.kind, end.payload)
