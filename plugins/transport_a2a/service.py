"""A2A tasks on the agent (seed A2aBridge): a message is a ``send`` to the conversation its
``contextId`` names, its task follows that one turn (``turn_events``) whoever listens, and every
task is durable (:mod:`agentik_transport_a2a.tasks`). A turn that waits for a person's approval
makes its task ``INPUT_REQUIRED``; a message in that task answers (:mod:`.approvals`). Works in
A2A 1.0 types; the JSON-RPC layer (:mod:`agentik_transport_a2a.jsonrpc`) converts for 0.3
clients."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import UTC
from typing import TYPE_CHECKING, Any

from a2a.types import a2a_pb2 as pb
from a2a.utils import errors
from a2a.utils.task import apply_history_length

from agentik.core.agent import ConversationClosed
from agentik.core.inbox import CANCELLED, NotWaiting
from agentik.core.store import utcnow
from agentik.core.types import (
    AppendText,
    ApprovalRequested,
    ContentPart,
    End,
    Error,
    Gap,
    ImagePart,
    Interrupted,
    InvalidInput,
    TextPart,
    ToolCall,
    UnknownReference,
    Via,
    Waiting,
    check_image_url,
)
from agentik_transport_a2a import approvals
from agentik_transport_a2a.tasks import StoredTask, TaskStore, status_row

if TYPE_CHECKING:
    from agentik.core.agent import ChatAgent, ChatConversation
    from agentik.core.events import StreamItem

log = logging.getLogger(__name__)

NAMESPACE = "a2a"  # of the conversation aliases: an A2A contextId names a conversation
VIA = Via("a2a")  # what the user records and UserMessage events say of A2A sends
REPLY = "reply"  # the artifact that carries the turn's text
S = pb.TaskState
TERMINAL = frozenset({S.TASK_STATE_COMPLETED, S.TASK_STATE_FAILED, S.TASK_STATE_CANCELED,
                      S.TASK_STATE_REJECTED})  # fmt: skip
#: where a reply to a request stops: the task is over, or waits for its client's answer
SETTLED = TERMINAL | {S.TASK_STATE_INPUT_REQUIRED}
CUT_OFF = "the task's turn was cut off by a server restart"
CONVERSATION_ID = "agentikConversationId"
#: seconds a cancel through an instance that does not follow the task waits for its end
CANCEL_WAIT = 10.0
#: seconds between its interrupts of the task's turn (one told before the turn started, or
#: lost, is said again)
INTERRUPT_AGAIN = 0.5
MAX_ID = 255  # characters of a client's contextId (it names a conversation for good)


def _now_status(state: int, text: str | None = None, task: pb.Task | None = None) -> pb.TaskStatus:
    status = pb.TaskStatus(state=state)  # type: ignore[arg-type]
    status.timestamp.GetCurrentTime()
    if text is not None and task is not None:
        status.message.CopyFrom(agent_message(task, text))
    return status


def _reply_artifact(text: str) -> pb.Artifact:
    return pb.Artifact(artifact_id=REPLY, name=REPLY, parts=[pb.Part(text=text)])


def agent_message(task: pb.Task, text: str) -> pb.Message:
    return pb.Message(
        message_id=str(uuid.uuid4()),
        context_id=task.context_id,
        task_id=task.id,
        role=pb.ROLE_AGENT,
        parts=[pb.Part(text=text)],
    )


class Update:
    """One streamed event of a task (1.0 ``StreamResponse`` field and its value); each JSON-RPC
    version's encoding is made once and shared by every listener (``memo``)."""

    __slots__ = ("kind", "memo", "value")

    def __init__(self, kind: str, value: Any) -> None:
        self.kind = kind  # "task" | "status_update" | "artifact_update"
        self.value = value
        self.memo: dict[str, bytes] = {}


class TaskRun:
    """A task whose turn has not ended: its live snapshot and the updates listeners follow."""

    def __init__(self, task: pb.Task, conv: ChatConversation, turn_id: str) -> None:
        self.task, self.conv, self.turn_id = task, conv, turn_id
        self.updates: list[Update] = []
        self.text: list[str] = []  # the reply's chunks published so far: the partial artifact
        self.held: str | None = None  # the newest chunk, published with the next event
        self.joining = False  # the chunks read now join the held one (see add_text)
        self.started = False  # its turn emitted its first event
        self.turn_over = False  # its turn emitted its End
        self.cancel_requested = False
        self.finished = asyncio.Event()
        self.asking = asyncio.Event()  # the task is INPUT_REQUIRED: its client is to answer
        self.asked: set[str] = set()  # the call ids its INPUT_REQUIRED statuses named
        self._waiters: list[asyncio.Future[None]] = []
        self.runner: asyncio.Task[None] | None = None
        #: the snapshot a streaming send starts with: taken before the task's durable write,
        #: so the updates of a turn that starts meanwhile stream after it, not folded into it
        self.first: tuple[pb.Task, int] | None = None

    def publish(self, update: Update) -> None:
        if self.held is not None:  # the chunk before it is not the last
            self._publish_chunk(self.held, last=False)
        self.updates.append(update)
        self._wake()

    def add_text(self, chunk: str) -> None:
        """A chunk of the reply. It goes out when the next event comes, so that the final one
        can carry ``lastChunk`` (:meth:`end_text`); chunks read together (published while the
        follower was busy) go out as one update: the same text, one frame for all."""
        if self.held is not None:
            if self.joining:
                self.held += chunk
                return
            self._publish_chunk(self.held, last=False)
        self.held = chunk
        self.joining = True

    def read_all(self) -> None:
        """The follower read what had been published: the next chunk is an update of its own."""
        self.joining = False

    def end_text(self) -> None:
        """The turn ended: its last chunk goes out marked ``lastChunk`` (an empty one when
        the text ended before a tool call)."""
        if self.held is not None:
            self._publish_chunk(self.held, last=True)
        elif self.text:
            self._publish_chunk("", last=True)

    def reply(self) -> str:
        return "".join(self.text) + (self.held or "")

    def _publish_chunk(self, chunk: str, *, last: bool) -> None:
        self.held = None
        value = (self.task.id, self.task.context_id, chunk, bool(self.text), last)
        self.updates.append(Update("artifact_update", value))
        self.text.append(chunk)
        self._wake()

    def finish(self) -> None:
        self.finished.set()
        self._wake()

    async def settled(self) -> None:
        """Until the task ends or waits for its client's answer (a blocking send's reply)."""
        if self.finished.is_set() or self.asking.is_set():
            return
        waits = [asyncio.ensure_future(e.wait()) for e in (self.finished, self.asking)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():  # a cancelled reader's own future is done
                waiter.set_result(None)

    def snapshot(self) -> tuple[pb.Task, int]:
        """A copy of the task now, with the reply so far as its artifact (what the updates up
        to here streamed), and the index of the first update after it."""
        copy = pb.Task()
        copy.CopyFrom(self.task)
        if self.text and not copy.artifacts:
            copy.artifacts.append(_reply_artifact("".join(self.text)))
        return copy, len(self.updates)

    async def follow(self, start: int) -> AsyncIterator[list[Update]]:
        """The updates from index ``start`` until the task ends, in lists: all that came while
        the reader was busy (one socket write for SSE)."""
        cursor = start
        loop = asyncio.get_running_loop()
        while True:
            if cursor < len(self.updates):
                batch = self.updates[cursor:]
                cursor += len(batch)
                yield batch
                continue
            if self.finished.is_set():
                return
            waiter = loop.create_future()  # one per reader: a reader that leaves cancels its own
            self._waiters.append(waiter)
            await waiter


class A2AService:
    """The A2A operations of one agent, on durable tasks."""

    def __init__(self, agent: ChatAgent, store: TaskStore) -> None:
        self.agent, self.store = agent, store
        self.runs: dict[str, TaskRun] = {}

    # --- start and stop ---------------------------------------------------------------------

    async def recover(self) -> int:
        """Settle the tasks a stop left unfinished, from the audit log: a turn that ended gives
        the task its end (one a crash cut off has the core's ``restart`` error: ``FAILED``);
        a turn still queued (it runs after the restart) is followed again. Returns how many."""
        count = 0
        for stored in await self.store.unfinished():
            count += 1
            end = await self.store.turn_end(stored.turn_id)
            conv = await self.agent.get_conversation(stored.conversation_id)
            if end is None and conv is not None and await conv.ownership.elsewhere(conv.id):
                # many instances: another one runs its conversation now, and the task is
                # followed there (or by the instance it was sent through): not a second time
                count -= 1
                continue
            if end is None and conv is not None:
                run = TaskRun(stored.task, conv, stored.turn_id)
                pending = [p for p in await conv.approvals() if p.turn_id == stored.turn_id]
                if pending:  # its turn waits for the answers, in the store
                    run.started = True
                    if stored.task.status.state == S.TASK_STATE_INPUT_REQUIRED:
                        run.asking.set()
                        run.asked.update(p.call_id for p in pending)
                    else:  # the stop came before the task asked: nothing else would now
                        self._ask(run, pending)
                        await self.store.save(run.task)
                self._start(run, after=0)
                continue
            task = stored.task
            if end is None:  # its conversation was deleted
                self._settle(task, S.TASK_STATE_FAILED, "", "the task's conversation was deleted")
            else:
                self._settle_from_record(task, *end)
            await self.store.save(task)
        if count:
            log.info("a2a: settled %d task(s) left unfinished by the last stop", count)
        return count

    async def settle_ended(self, grace: float) -> int:
        """Many instances: a task is followed by the instance it was sent through, and when
        that one dies while another instance runs the turn, nobody records the task's end.
        Settle, from the audit log, each unfinished task not followed here whose turn ended
        more than ``grace`` seconds ago (a live follower records it within moments, and a
        second write of the same end changes nothing). Returns how many."""
        count = 0
        for stored in await self.store.unfinished():
            if stored.task.id in self.runs:
                continue
            end = await self.store.core.turn_end(stored.turn_id)
            if end is None or (utcnow() - end.created_at).total_seconds() < grace:
                continue
            self._settle_from_record(stored.task, end.kind, end.payload)
            await self.store.save(stored.task)
            count += 1
        if count:
            log.info("a2a: settled %d task(s) whose follower was gone", count)
        return count

    async def close(self) -> None:
        runners = [r.runner for r in self.runs.values() if r.runner is not None]
        for runner in runners:
            runner.cancel()
        for runner in runners:
            with contextlib.suppress(asyncio.CancelledError):
                await runner

    # --- the operations ---------------------------------------------------------------------

    async def send(self, request: pb.SendMessageRequest) -> TaskRun:
        """Record the message in its context's conversation and start its task."""
        message = request.message
        if not request.HasField("message"):
            raise errors.InvalidParamsError(message="message is required")
        if not message.message_id:
            raise errors.InvalidParamsError(message="message.messageId is required")
        if message.role != pb.ROLE_USER:  # missing, ROLE_UNSPECIFIED or ROLE_AGENT
            raise errors.InvalidParamsError(message="message.role must be ROLE_USER")
        if not message.parts:
            raise errors.InvalidParamsError(message="message.parts must not be empty")
        if request.configuration.history_length < 0:
            raise errors.InvalidParamsError(message="historyLength must be non-negative")
        context_id = message.context_id
        if len(context_id) > MAX_ID or len(message.task_id) > MAX_ID:
            raise errors.InvalidParamsError(message=f"ids may be at most {MAX_ID} characters")
        if message.task_id:
            stored = await self.get_stored(message.task_id)
            if stored is None:
                raise errors.TaskNotFoundError(message=f"task {message.task_id} not found")
            if context_id and context_id != stored.task.context_id:
                raise errors.InvalidParamsError(
                    message=f"context {context_id} does not match context "
                    f"{stored.task.context_id} of task {message.task_id}"
                )
            run = self.runs.get(message.task_id)
            if run is not None and run.task.status.state == S.TASK_STATE_INPUT_REQUIRED:
                return await self._answer(run, message)
            state = S.Name(stored.task.status.state)
            if run is not None and any(m.message_id == message.message_id
                                       for m in run.task.history):  # fmt: skip
                return run  # an answer sent again: what it did stands
            raise errors.UnsupportedOperationError(
                message=f"task {message.task_id} is {state}: each message starts a new task; "
                "send it with the task's contextId instead"
            )
        content = self._content(message.parts)
        context_id = context_id or str(uuid.uuid4())
        try:
            conv = await self.agent.aliased_conversation(NAMESPACE, context_id)
            after, sent = conv.last_event_id, utcnow()
            # a client that resends a message it got no answer for starts no second turn
            record = await conv.send(content, idempotency_key=f"a2a:{message.message_id}", via=VIA)
        except InvalidInput as e:
            raise errors.InvalidParamsError(message=str(e)) from None
        except ConversationClosed as e:
            raise errors.InternalError(message=str(e)) from None
        if record.created_at < sent:  # the message was sent before: its task, not a new one
            known = await self._task_of_turn(conv, record.id)
            if known is not None:
                return known
        task = pb.Task(
            id=str(uuid.uuid4()), context_id=context_id, status=_now_status(S.TASK_STATE_SUBMITTED)
        )
        task.metadata[CONVERSATION_ID] = conv.id
        user = task.history.add()
        user.CopyFrom(message)
        user.context_id, user.task_id = context_id, task.id
        user.role = pb.ROLE_USER
        run = TaskRun(task, conv, record.id)
        self._start(run, after)  # before the write: nothing of the turn is missed meanwhile
        run.first = run.snapshot()
        await self.store.insert(task, conv.id, record.id)
        return run

    async def _answer(self, run: TaskRun, message: pb.Message) -> TaskRun:
        """A message in an ``INPUT_REQUIRED`` task: its answers to the approvals the task's turn
        waits for. All are checked before any is given; the task goes ``WORKING`` once none is
        left waiting (its reply then streams from here), else asks for the rest."""
        task = run.task
        if any(m.message_id == message.message_id for m in task.history):
            return run  # sent again: answered already
        pending = [p for p in await run.conv.approvals() if p.turn_id == run.turn_id]
        answers = approvals.read_answers(task.id, message.parts, pending)
        try:
            await approvals.answer(run.conv, run.turn_id, answers)
        except (NotWaiting, UnknownReference) as e:  # answered elsewhere meanwhile
            raise errors.InvalidParamsError(message=f"not answered: {e}") from None
        user = task.history.add()
        user.CopyFrom(message)
        user.context_id, user.task_id, user.role = task.context_id, task.id, pb.ROLE_USER
        answered = {call_id for call_id, _ in answers}
        left = [p for p in pending if p.call_id not in answered]
        if task.status.state == S.TASK_STATE_INPUT_REQUIRED:
            if left:
                self._ask(run, left)
            else:
                self._work(run)
        await self.store.save(task)
        run.first = run.snapshot()
        return run

    def _ask(self, run: TaskRun, pending: list[Any]) -> None:
        task = run.task
        run.asked.update(p.call_id for p in pending)
        status = _now_status(S.TASK_STATE_INPUT_REQUIRED)
        status.message.CopyFrom(approvals.input_message(task, pending))
        task.status.CopyFrom(status)
        run.publish(Update("status_update", self._status_event(task)))
        run.asking.set()

    def _work(self, run: TaskRun) -> None:
        run.asking.clear()
        run.task.status.CopyFrom(_now_status(S.TASK_STATE_WORKING))
        run.publish(Update("status_update", self._status_event(run.task)))

    async def _task_of_turn(self, conv: ChatConversation, turn_id: str) -> TaskRun | None:
        """The task that answers ``turn_id`` already: a live run, or a stored one (as a run
        that is over)."""
        for run in self.runs.values():
            if run.turn_id == turn_id:
                return run
        stored = await self.store.by_turn(turn_id)
        if stored is None:
            return None
        run = TaskRun(stored.task, conv, turn_id)
        run.finish()
        return run

    def _content(self, parts: Any) -> list[ContentPart]:
        """Text parts; image parts (``raw`` or ``url`` with an ``image/*`` media type) only when
        the model takes images; anything else is refused with the spec's -32005."""
        images = bool((self.agent.llm.capabilities or {}).get("image_input"))
        content: list[ContentPart] = []
        for part in parts:
            kind = part.WhichOneof("content")
            if kind == "text":
                content.append(TextPart(part.text))
            elif images and kind in ("raw", "url") and part.media_type.startswith("image/"):
                if kind == "raw":
                    data = base64.b64encode(part.raw).decode()
                    content.append(ImagePart(part.media_type, data=data))
                else:
                    try:
                        url = check_image_url(part.url, "part")
                    except InvalidInput as e:
                        raise errors.InvalidParamsError(message=str(e)) from None
                    content.append(ImagePart(part.media_type, url=url))
            else:
                what = "text and image" if images else "text"
                raise errors.ContentTypeNotSupportedError(
                    message=f"only {what} parts are supported, got a {kind or 'empty'} part"
                    + (f" of {part.media_type}" if part.media_type else "")
                )
        return content

    async def get_stored(self, task_id: str) -> StoredTask | None:
        run = self.runs.get(task_id)
        if run is not None:
            return StoredTask(run.snapshot()[0], run.conv.id, run.turn_id)
        return await self.store.get(task_id)

    async def get(self, request: pb.GetTaskRequest) -> pb.Task:
        if request.history_length < 0:
            raise errors.InvalidParamsError(message="historyLength must be non-negative")
        stored = await self.get_stored(request.id)
        if stored is None:
            raise errors.TaskNotFoundError(message=f"task {request.id} not found")
        return apply_history_length(stored.task, request)

    async def cancel(self, request: pb.CancelTaskRequest) -> pb.Task:
        """Interrupt the task's turn. A task still queued behind other turns is ``CANCELED`` at
        once and its turn interrupted as soon as it starts (its message stays in the
        conversation: the audit log is append-only)."""
        run = self.runs.get(request.id)
        if run is None:
            stored = await self.store.get(request.id)
            if stored is None:
                raise errors.TaskNotFoundError(message=f"task {request.id} not found")
            cancelled = await self._cancel_elsewhere(stored)
            if cancelled is not None:
                return cancelled
            raise errors.TaskNotCancelableError(
                message=f"task {request.id} is {S.Name(stored.task.status.state)}"
            )
        if run.task.status.state in TERMINAL:
            raise errors.TaskNotCancelableError(
                message=f"task {request.id} is {S.Name(run.task.status.state)}"
            )
        if run.turn_over:  # its end is being recorded
            await run.finished.wait()
            raise errors.TaskNotCancelableError(
                message=f"task {request.id} is {S.Name(run.task.status.state)}"
            )
        run.cancel_requested = True
        if run.started and run.conv.interrupt(run.turn_id):
            await run.finished.wait()
            return run.snapshot()[0]
        run.task.status.CopyFrom(_now_status(S.TASK_STATE_CANCELED))
        await self.store.save(run.task)
        if not run.started and await run.conv.cancel_queued(run.turn_id):
            # its turn will never run, not after a restart either: stop following it (the
            # follower's end publishes the final status)
            assert run.runner is not None
            run.runner.cancel()
            await run.finished.wait()
            return run.snapshot()[0]
        run.publish(Update("status_update", self._status_event(run.task)))
        return run.snapshot()[0]

    async def _cancel_elsewhere(self, stored: StoredTask) -> pb.Task | None:
        """A task another instance follows (many instances on one database): its turn is
        stopped through the conversation, which passes it on to the instance that runs it,
        whose follower records the task ``CANCELED``; None when its turn is over or unknown."""
        if stored.task.status.state in TERMINAL:
            return None
        conv = await self.agent.get_conversation(stored.conversation_id)
        open_turns = [t.id for t in await self.agent.store.open_turns(stored.conversation_id)]
        if conv is None or stored.turn_id not in open_turns:
            return None
        # not started: taken out of the queue (its owner says whether it started it: a turn is
        # recorded running only at its first step); started: interrupted on its owner. Where
        # no answer came, it may be either: the interrupt names the turn (the owner stops no
        # other), and the owner is asked again while the store says it is queued.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CANCEL_WAIT
        interrupted_at = -INTERRUPT_AGAIN
        while loop.time() < deadline:
            if await conv.cancel_queued(stored.turn_id):
                task: pb.Task = stored.task
                self._settle(task, S.TASK_STATE_CANCELED, "")
                await self.store.save(task)
                return task
            now = await self.store.get(stored.task.id)
            if now is not None and now.task.status.state in TERMINAL:
                ended: pb.Task = now.task  # its follower recorded its end
                return ended
            if loop.time() - interrupted_at >= INTERRUPT_AGAIN:  # (a notification may be lost)
                interrupted_at = loop.time()
                await conv.ainterrupt(stored.turn_id)
            await asyncio.sleep(0.05)
        return None

    async def subscribe(self, task_id: str) -> TaskRun:
        run = self.runs.get(task_id)
        if run is not None and run.task.status.state not in TERMINAL:
            return run
        stored = await self.store.get(task_id) if run is None else None
        if run is None and stored is None:
            raise errors.TaskNotFoundError(message=f"task {task_id} not found")
        state = (run.task if run is not None else stored.task).status.state  # type: ignore[union-attr]
        raise errors.UnsupportedOperationError(
            message=f"task {task_id} is in terminal state: {S.Name(state)}"
        )

    async def list(self, request: pb.ListTasksRequest, max_size: int) -> pb.ListTasksResponse:
        if request.history_length < 0:
            raise errors.InvalidParamsError(message="historyLength must be non-negative")
        size = request.page_size or 50
        if not 1 <= size <= max_size:
            raise errors.InvalidParamsError(message=f"pageSize must be between 1 and {max_size}")
        token = request.page_token
        if token and not (token.isascii() and token.isdigit() and len(token) < 10):
            raise errors.InvalidParamsError(message="pageToken is not one this server gave")
        offset = int(token or 0)
        after = ""
        if request.HasField("status_timestamp_after"):
            after = request.status_timestamp_after.ToDatetime(tzinfo=UTC).isoformat()
        states = {i: r.task.status.state for i, r in self.runs.items()}
        tasks, total = await self.store.page(
            request.context_id, request.status, after, offset, size, states
        )
        response = pb.ListTasksResponse(page_size=size, total_size=total)
        if offset + len(tasks) < total:
            response.next_page_token = str(offset + len(tasks))
        for task in tasks:
            live = self.runs.get(task.id)
            if live is not None:
                task = live.snapshot()[0]
            if not request.include_artifacts:
                task.ClearField("artifacts")
            response.tasks.append(apply_history_length(task, request))
        return response

    # --- following a turn -------------------------------------------------------------------

    def _start(self, run: TaskRun, after: int) -> None:
        self.runs[run.task.id] = run
        run.runner = asyncio.create_task(self._follow(run, after), name=f"a2a-{run.task.id}")

    @staticmethod
    def _status_event(task: pb.Task) -> pb.TaskStatusUpdateEvent:
        return pb.TaskStatusUpdateEvent(
            task_id=task.id, context_id=task.context_id, status=task.status
        )

    @staticmethod
    async def _items(run: TaskRun, after: int) -> AsyncGenerator[StreamItem, None]:
        """The turn's items, telling ``run`` where each read of the log ends (its chunks read
        together are joined)."""
        batches = run.conv.turn_batches(run.turn_id, after)
        try:
            async for batch in batches:
                for item in batch:
                    yield item
                run.read_all()
        finally:
            await batches.aclose()

    async def _follow(self, run: TaskRun, after: int) -> None:
        task, conv = run.task, run.conv
        error: str | None = None
        # its turn was taken out of the queue on another instance: it ends with that Error
        interrupted = ended = lost = cancelled = False
        earlier: list[dict[str, str]] = []  # statuses kept in memory: stored with the end
        try:
            async for item in self._items(run, after):
                event = item.event
                if isinstance(event, Gap):
                    lost = True  # fell behind the replay buffer: the text comes from the log
                    continue
                if isinstance(event, Error) and event.code == CANCELLED and not run.started:
                    cancelled = True  # it never started: no WORKING status first
                    continue
                if isinstance(event, End) and cancelled:
                    ended = run.turn_over = True
                    continue
                if not run.started:
                    run.started = True
                    if run.cancel_requested:
                        conv.interrupt(run.turn_id)
                    elif task.status.state == S.TASK_STATE_SUBMITTED:
                        task.status.CopyFrom(_now_status(S.TASK_STATE_WORKING))
                        run.publish(Update("status_update", self._status_event(task)))
                        # in memory and the stream until the task ends or waits (a restart
                        # settles it from the audit log); ListTasks sees it through self.runs
                        earlier.append(status_row(task))
                if isinstance(event, ApprovalRequested):
                    if event.call_id not in run.asked and not run.cancel_requested:
                        # every call of the step that waits, read once the turn waits for them
                        pending = await conv.approvals()
                        pending = [p for p in pending if p.turn_id == run.turn_id]
                        if pending:
                            self._ask(run, pending)
                            await self.store.save(task, earlier)  # a restart finds what it asked
                            earlier.clear()
                    continue
                if isinstance(event, Waiting):
                    continue  # the step's last event when it waits: what it asked stands
                if task.status.state == S.TASK_STATE_INPUT_REQUIRED and not run.cancel_requested:
                    self._work(run)  # answered (here, over HTTP, or by the timeout): on it goes
                    await self.store.save(task)  # a restart does not ask again
                if isinstance(event, AppendText):
                    if not event.reasoning:
                        run.add_text(event.text)
                elif isinstance(event, ToolCall):
                    progress = _now_status(S.TASK_STATE_WORKING, f"calling {event.tool_name}", task)
                    progress.message.metadata["toolCall"] = {
                        "callId": event.call_id,
                        "name": event.tool_name,
                        "arguments": event.args_json,
                    }
                    if not run.cancel_requested:
                        task.status.CopyFrom(progress)
                        run.publish(Update("status_update", self._status_event(task)))
                elif isinstance(event, Error):
                    error = event.message
                elif isinstance(event, Interrupted):
                    interrupted = True
                elif isinstance(event, End):
                    ended = run.turn_over = True
                    run.end_text()
            end = None if ended and not lost else await self.store.turn_end(run.turn_id)
            if end is not None:
                self._settle_from_record(task, *end, cancel=run.cancel_requested)
            elif not ended:
                # the log closed (shutdown) before the turn ran: it runs after the next start,
                # where recover() follows it again
                return
            elif cancelled:
                self._settle(task, S.TASK_STATE_CANCELED, "")
            elif error is not None:
                self._settle(task, S.TASK_STATE_FAILED, run.reply(), error)
            elif interrupted or run.cancel_requested:
                self._settle(task, S.TASK_STATE_CANCELED, run.reply())
            else:
                self._settle(task, S.TASK_STATE_COMPLETED, run.reply())
            # the end waits for no fsync of its own: it is the turn's end in the audit log,
            # which is not fsynced either; a power loss that takes it leaves the task
            # unfinished, and recover() settles it from the log as after a crash
            await self.store.save(task, earlier, durable=False)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("a2a: following the turn of task %s failed", task.id)
            self._settle(task, S.TASK_STATE_FAILED, run.reply(), "internal error")
            with contextlib.suppress(Exception):
                await self.store.save(task, earlier)
        finally:
            self.runs.pop(task.id, None)
            if task.status.state in TERMINAL:
                run.publish(Update("status_update", self._status_event(task)))
            run.finish()

    def _settle_from_record(
        self, task: pb.Task, kind: str, payload: dict[str, Any], cancel: bool = False
    ) -> None:
        if kind == "error" and payload.get("code") == CANCELLED:  # taken out of the queue
            self._settle(task, S.TASK_STATE_CANCELED, "")
        elif kind == "error":
            message = payload.get("message") or "the turn failed"
            if payload.get("code") == "restart":
                message = CUT_OFF
            self._settle(task, S.TASK_STATE_FAILED, payload.get("partialText", ""), message)
        elif payload.get("interrupted") or cancel:
            self._settle(task, S.TASK_STATE_CANCELED, payload.get("text", ""))
        else:
            self._settle(task, S.TASK_STATE_COMPLETED, payload.get("text", ""))

    @staticmethod
    def _settle(task: pb.Task, state: int, text: str, error: str | None = None) -> None:
        """The task's end: the reply as its artifact and in its history, the error (if any) in
        its status message."""
        if text:
            del task.artifacts[:]
            task.artifacts.append(_reply_artifact(text))
            task.history.append(agent_message(task, text))
        task.status.CopyFrom(_now_status(state, error, task))
