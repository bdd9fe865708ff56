"""A remote agentik, used exactly like the in-process agent (``docs/client.md``).

:class:`RemoteAgent` and :class:`RemoteConversation` speak the server's HTTP+SSE API
(``docs/http_api.md``) and satisfy the same protocol as ``ChatAgent`` / ``ChatConversation``
(:mod:`agentik.core.protocol`)::

    async with RemoteAgent("http://localhost:8080") as agent:
        conv = await agent.create_conversation(title="hello")
        events = conv.events()                 # subscribed now: it sees the whole turn
        await conv.send([TextPart("hi")])
        async for event in events:
            if event.type == "End":
                break

What the network adds is handled here: a send is retried with the same ``Idempotency-Key`` when
its connection breaks (so it is never stored twice), an event stream that drops reconnects with
``Last-Event-ID`` and goes on where it stopped (a ``Gap`` the server reports is passed on), and
an HTTP error is raised as :class:`APIError` with the server's code and message. How long it
keeps trying is ``retry_for`` (None: for as long as the caller waits), and ``on_retry`` hears
of every failed try and of the recovery (``agentik chat`` shows ``[reconnecting… 3s]``).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, TypeAlias
from urllib.parse import quote

import aiohttp

from agentik.core.approvals import Approval, PendingApproval
from agentik.core.types import (
    ContentPart,
    ConversationInfo,
    Event,
    Message,
    MessageContext,
    content_to_json,
    event_from_json,
    message_from_json,
)

__all__ = [
    "APIError",
    "ClientError",
    "ConnectionFailed",
    "NotFound",
    "RemoteAgent",
    "RemoteConversation",
    "RemoteEventStream",
    "SentMessage",
    "Unauthorized",
]

DEFAULT_URL = "http://localhost:8080"
API = "/agentik"
#: "not done": safe to do again (429: this client is over its connection limits for now)
RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
NETWORK_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError)
FIRST_DELAY, MAX_DELAY = 0.05, 1.0  # seconds between tries: doubling up to the cap
#: ``on_retry(what, seconds, failure)``: after each failed try of ``what`` (``seconds`` since its
#: first failure), and once with ``failure=None`` when a try after failures succeeds
RetryHook: TypeAlias = Callable[[str, float, Exception | None], None]
ExportFormat: TypeAlias = Literal["md", "json"]


class ClientError(Exception):
    """Anything the client could not do."""


class ConnectionFailed(ClientError):
    """The server could not be reached (or kept failing) for ``retry_for`` seconds."""


class APIError(ClientError):
    """The server refused a request: its HTTP status and its ``error.code`` / ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class NotFound(APIError):
    """404: no such conversation (or message)."""


class Unauthorized(APIError):
    """401: the server needs an API key (``api_key=`` or ``AGENTIK_API_KEY``) or refused it."""


def key_from_environment() -> str | None:
    """The first key of ``AGENTIK_API_KEY`` (a comma list, or ``@file``), as the server reads
    it; None when unset."""
    raw = os.environ.get("AGENTIK_API_KEY", "").strip()
    if not raw:
        return None
    from agentik.core.security import parse_api_keys

    try:
        return parse_api_keys(raw)[0]
    except ValueError as e:
        raise ClientError(f"AGENTIK_API_KEY: {e}") from None


async def _api_error(resp: aiohttp.ClientResponse) -> APIError:
    text = await resp.text(errors="replace")
    code, message = f"http_{resp.status}", text.strip()[:500] or resp.reason or ""
    try:
        error = json.loads(text)["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        pass
    kind = {404: NotFound, 401: Unauthorized}.get(resp.status, APIError)
    return kind(resp.status, code, message)


def _why(error: Exception) -> str:
    if isinstance(error, TimeoutError):
        return "timed out"
    return f"{type(error).__name__}: {error}" if not isinstance(error, APIError) else str(error)


class _Retries:
    """The waits between tries of one thing: growing delays up to :data:`MAX_DELAY`, then
    :class:`ConnectionFailed` once the agent's ``retry_for`` seconds have passed (never when it
    is None). Each wait and the recovery are told to the agent's ``on_retry``."""

    def __init__(self, agent: RemoteAgent, what: str) -> None:
        self.loop = asyncio.get_running_loop()
        self.seconds = agent.retry_for
        self.start = self.loop.time()
        self.deadline = None if self.seconds is None else self.start + self.seconds
        self.what = what
        self.delay = FIRST_DELAY
        self.hook = agent.on_retry
        self.failed = False

    async def wait(self, failure: Exception) -> None:
        now = self.loop.time()
        if self.deadline is not None and now + self.delay > self.deadline:
            raise ConnectionFailed(
                f"{self.what}: gave up after {self.seconds:g} s: {_why(failure)}"
            ) from failure
        self.failed = True
        if self.hook is not None:
            self.hook(self.what, now - self.start, failure)
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, MAX_DELAY)

    def succeeded(self) -> None:
        if self.failed and self.hook is not None:
            self.hook(self.what, self.loop.time() - self.start, None)


@dataclass(frozen=True, slots=True)
class SentMessage(Message):
    """What :meth:`RemoteConversation.send` returns: the stored user message, and where its
    turn stood when the server answered: ``queued``, ``running``, ``waiting``, ``done``,
    ``interrupted``, ``failed`` or ``cancelled``, with ``error`` the code of a failed or
    cancelled one. A send whose first answer was lost and that was retried (same idempotency
    key) may find its turn over already; ``failed`` with ``error == "restart"`` means a crash
    cut it and it was not resumed: nothing will answer it, send the message again."""

    turn: str = "queued"
    error: str | None = None


def _info(data: dict[str, Any]) -> ConversationInfo:
    return ConversationInfo(
        data["id"],
        data["title"],
        data["temp"],
        datetime.fromisoformat(data["createdAt"]),
        datetime.fromisoformat(data["updatedAt"]),
    )


class RemoteAgent:
    """An agentik server, used like ``ChatAgent`` (:class:`agentik.core.protocol.Agent`).

    ``api_key``: sent as ``Authorization: Bearer``; by default ``AGENTIK_API_KEY``'s first key.
    ``timeout``: seconds for one request. ``retry_for``: how long a request that may be
    repeated (reads, renames, sends, which carry an idempotency key) and a dropped event stream
    keep trying to reach the server before :class:`ConnectionFailed`; None: until the caller
    stops waiting (cancels). ``stream_idle``: seconds without a byte (the server pings every
    ``AGENTIK_SSE_HEARTBEAT``, 15 s by default) after which an event stream counts as dropped
    and reconnects. ``sender``: the name sends give by default (other viewers see it in
    ``UserMessage`` events). ``on_retry``: see :data:`RetryHook` (it must not raise).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        retry_for: float | None = 30.0,
        stream_idle: float = 60.0,
        session: aiohttp.ClientSession | None = None,
        sender: str | None = None,
        on_retry: RetryHook | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ClientError(f"the URL must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.api_key = api_key if api_key is not None else key_from_environment()
        self.timeout = timeout
        self.retry_for = retry_for
        self.stream_idle = stream_idle
        self.sender = sender
        self.on_retry = on_retry
        self._session = session
        self._own_session = session is None
        self._headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        #: streams still connecting: a change waits for them, so a stream made before it sees
        #: its events (as ``conv.events()`` made before ``send`` does in process)
        self._opening: set[asyncio.Future[Any]] = set()
        self._streams: set[RemoteEventStream] = set()

    async def __aenter__(self) -> RemoteAgent:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        for stream in list(self._streams):
            await stream.aclose()
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    # --- the protocol -------------------------------------------------------------------------

    async def create_conversation(
        self, temp: bool = False, title: str | None = None
    ) -> RemoteConversation:
        data = await self.request("POST", "/conversations", json={"temp": temp, "title": title})
        return RemoteConversation(self, data)

    async def get_conversation(self, conversation_id: str) -> RemoteConversation | None:
        try:
            data = await self.request("GET", f"/conversations/{quote(conversation_id, safe='')}")
        except NotFound:
            return None
        return RemoteConversation(self, data)

    async def list_conversations(self, offset: int = 0, limit: int = 50) -> list[ConversationInfo]:
        """A page of persisted conversations, most recently updated first (limit ≤ 200)."""
        page = await self.request(
            "GET", "/conversations", params={"offset": offset, "limit": limit}
        )
        return [_info(item) for item in page["items"]]

    async def delete_conversation(self, conversation_id: str) -> bool:
        try:
            await self.request("DELETE", f"/conversations/{quote(conversation_id, safe='')}")
        except NotFound:
            return False
        return True

    def events(self, after: int | None = None) -> RemoteEventStream:
        """Agent-level events (``AgentEvent``) after the event id ``after``; None: from now."""
        return RemoteEventStream(self, f"{API}/events", after)

    # --- HTTP ---------------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        retry: bool | None = None,
        text: bool = False,
    ) -> Any:
        """One API call (``path`` under ``/agentik``); the decoded JSON answer (None for 204),
        or with ``text`` the body as text. ``retry`` (default: for GET and PATCH) repeats it
        after a network error or a 502-504 for up to ``retry_for`` seconds: only for requests
        that are safe to do twice."""
        if method != "GET" and self._opening:
            await asyncio.wait(list(self._opening), timeout=self.timeout)
        if retry is None:
            retry = method in ("GET", "PATCH")
        retries = _Retries(self, f"{method} {path}")
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        while True:
            try:
                async with self.session.request(
                    method,
                    f"{self.url}{API}{path}",
                    json=json,
                    params=params,
                    headers={**self._headers, **(headers or {})},
                    timeout=timeout,
                ) as resp:
                    if resp.status not in RETRYABLE_STATUS:
                        retries.succeeded()  # the server answered
                    if resp.status < 300:
                        if resp.status == 204:
                            return None
                        return await (resp.text() if text else resp.json())
                    error = await _api_error(resp)
                    if not retry or resp.status not in RETRYABLE_STATUS:
                        raise error
                    failure: Exception = error
            except NETWORK_ERRORS as e:
                if not retry:
                    raise ConnectionFailed(f"{method} {path}: {_why(e)}") from e
                failure = e
            await retries.wait(failure)


class RemoteConversation:
    """A conversation on the server, used like ``ChatConversation``
    (:class:`agentik.core.protocol.Conversation`). Its attributes are those of the last answer
    about it (:meth:`refresh` reads them again)."""

    def __init__(self, agent: RemoteAgent, data: dict[str, Any]) -> None:
        self.agent = agent
        self.id: str = data["id"]
        self._path = f"/conversations/{quote(self.id, safe='')}"
        self._update(data)

    def _update(self, data: dict[str, Any]) -> None:
        info = _info(data)
        self.title = info.title
        self.is_temporal = info.is_temporal
        self.created_at = info.created_at
        self.updated_at = info.updated_at
        self.busy: bool = data.get("busy", False)
        self.supports_image_input: bool = data.get("supportsImageInput", False)
        self.supports_image_output: bool = data.get("supportsImageOutput", False)

    def __repr__(self) -> str:
        return f"<RemoteConversation {self.id} title={self.title!r}>"

    async def refresh(self) -> None:
        self._update(await self.agent.request("GET", self._path))

    async def send(
        self,
        content: Sequence[ContentPart],
        context: MessageContext | None = None,
        *,
        idempotency_key: str | None = None,
        sender: str | None = None,
    ) -> SentMessage:
        """Record the user message and queue its turn (202); returns the stored record with
        its turn's state (:class:`SentMessage`). Sent with an ``Idempotency-Key`` (a new one
        unless given) and retried with it after a broken connection: the server stores the
        message once however often it arrives. ``sender`` (default: the agent's) names this
        client to other viewers."""
        body: dict[str, Any] = {"content": content_to_json(list(content))}
        if context is not None:
            body["context"] = context.to_json()
        sender = sender or self.agent.sender
        if sender is not None:
            body["sender"] = sender
        key = idempotency_key or uuid.uuid4().hex
        data = await self.agent.request(
            "POST",
            f"{self._path}/messages",
            json=body,
            headers={"Idempotency-Key": key},
            retry=True,
        )
        turn, error = data.pop("turn", "queued"), data.pop("error", None)
        m = message_from_json(data)
        return SentMessage(m.id, m.conversation_id, m.kind, m.created_at, m.payload, turn, error)

    def events(self, after: int | None = None) -> RemoteEventStream:
        """Turn events after the event id ``after``; None: from this call on (a send made after
        it waits until the stream is subscribed, so the stream sees the whole turn)."""
        return RemoteEventStream(self.agent, f"{API}{self._path}/events", after)

    async def get_messages(
        self, after: str | None = None, offset: int = 0, limit: int = 50
    ) -> list[Message]:
        """A page of the history, oldest first (``after``: a message id; limit ≤ 200)."""
        params: dict[str, Any] = {"offset": offset, "limit": limit}
        if after is not None:
            params["after"] = after
        page = await self.agent.request("GET", f"{self._path}/messages", params=params)
        return [message_from_json(m) for m in page["items"]]

    async def rename(self, title: str | None) -> None:
        self._update(await self.agent.request("PATCH", self._path, json={"title": title}))

    async def ainterrupt(self) -> bool:
        """Stop the running turn (queued sends still run); False when none was running."""
        answer = await self.agent.request("POST", f"{self._path}/interrupt")
        return bool(answer["interrupted"])

    async def approvals(self) -> list[PendingApproval]:
        """The tool calls of this conversation waiting for a person's approval, in order."""
        page = await self.agent.request("GET", f"{self._path}/approvals")
        return [
            PendingApproval(
                a["callId"], a["toolName"], a["argsJson"], a["turnId"], a.get("requestedAt")
            )
            for a in page["items"]
        ]

    async def approve(
        self, call_id: str, *, note: str | None = None, args: dict[str, Any] | None = None
    ) -> str:
        """Approve a waiting tool call, with ``args`` to run it with instead of the model's;
        returns its turn's state then (``running`` once every call of the step is answered).
        An :class:`APIError` with status 409 when it was answered already, 400 when ``args``
        do not fit the tool."""
        return await self._answer(call_id, Approval(True, note, args))

    async def deny(self, call_id: str, *, note: str | None = None) -> str:
        """Deny a waiting tool call (the model is told, with the ``note``); see :meth:`approve`."""
        return await self._answer(call_id, Approval(False, note))

    async def _answer(self, call_id: str, approval: Approval) -> str:
        path = f"{self._path}/approvals/{quote(call_id, safe='')}"
        answer = await self.agent.request("POST", path, json=approval.to_json())
        return str(answer["turn"])

    async def export(self, format: ExportFormat = "md") -> str:
        """The whole conversation as the server exports it: Markdown (``md``) or JSON text
        (``json``: the conversation, every record, the token stats)."""
        answer = await self.agent.request(
            "GET", f"{self._path}/export", params={"format": format}, text=True
        )
        return str(answer)

    async def token_stats(self) -> dict[str, Any]:
        """``{"turns", "input", "output", "total", "contextTokens"}`` (docs/http_api.md)."""
        return await self.agent.request("GET", f"{self._path}/stats")  # type: ignore[no-any-return]


class RemoteEventStream:
    """Server-sent events as typed :class:`~agentik.core.types.Event` objects.

    It subscribes when made (not at the first read). When the connection drops, the server
    restarts or nothing arrives for ``stream_idle`` seconds, it reconnects with
    ``Last-Event-ID`` and goes on after the last event it yielded: nothing is repeated, and what
    the server no longer has comes as the server's ``Gap``. A read the caller gives up on (a
    timeout around ``__anext__``) loses nothing and ends nothing: the next read goes on. It
    ends when its conversation is deleted; :class:`ConnectionFailed` when the server stays out
    of reach for ``retry_for`` seconds. ``last_event_id`` is the id to resume from later.
    """

    def __init__(self, agent: RemoteAgent, path: str, after: int | None) -> None:
        self.agent = agent
        self.url = f"{agent.url}{path}"
        self.last_event_id = after
        self._opening: asyncio.Future[aiohttp.ClientResponse | None] | None = asyncio.ensure_future(
            self._connect(first=True)
        )
        agent._opening.add(self._opening)
        self._opening.add_done_callback(agent._opening.discard)
        self._opening.add_done_callback(lambda f: f.cancelled() or f.exception())  # read later
        agent._streams.add(self)
        self._resp: aiohttp.ClientResponse | None = None  # the connection being read
        self._buffer = b""  # the start of a frame not complete yet
        #: parsed, not yielded yet: (event id, event); an id alone moves the resume point
        self._ready: deque[tuple[int | None, Event | None]] = deque()
        self._closed = False

    def __aiter__(self) -> RemoteEventStream:
        return self

    @property
    def pending(self) -> int:
        """Frames already read and not yielded yet: the next reads return at once (a reader
        may wait with its output until this is 0)."""
        return len(self._ready)

    async def __anext__(self) -> Event:
        # state lives on the object, not in a generator: a read cancelled at any await (a
        # caller's timeout) leaves the stream as it was, and the next read goes on
        ready = self._ready
        while not ready:
            resp = self._resp
            if resp is None or self._closed:
                resp = await self._reconnect()  # StopAsyncIteration when closed or gone
            try:
                chunk = await resp.content.readany()
            except NETWORK_ERRORS:
                chunk = b""  # dropped: resume below
            if self._closed:
                raise StopAsyncIteration
            if not chunk:
                resp.close()
                self._resp = None
                continue
            buffer = self._buffer + chunk if self._buffer else chunk
            end = buffer.find(b"\n\n")
            if end < 0:
                self._buffer = buffer
            elif end == len(buffer) - 2:  # one whole frame: the usual chunk of a live stream
                self._buffer = b""
                seq, event = self._parse(buffer[:end])
                if seq is not None:
                    self.last_event_id = seq
                if event is not None:
                    return event
            else:
                *frames, self._buffer = buffer.split(b"\n\n")
                ready.extend(map(self._parse, frames))
        while ready:
            seq, event = ready.popleft()
            if seq is not None:
                self.last_event_id = seq  # as each is yielded: the resume point is exact
            if event is not None:
                return event
        return await self.__anext__()  # only ids or comments were ready

    async def aclose(self) -> None:
        """Stop reading; a task waiting for the next event gets ``StopAsyncIteration``."""
        self._closed = True
        self.agent._streams.discard(self)
        opening = self._opening
        if opening is not None and not opening.done():
            opening.cancel()
        elif opening is not None and not opening.cancelled() and opening.exception() is None:
            resp = opening.result()
            if resp is not None:
                resp.close()
        if self._resp is not None:
            self._resp.close()  # wakes a reader in another task, which then stops

    async def _reconnect(self) -> aiohttp.ClientResponse:
        """The connection to read: the subscription made with the stream, else a new one
        from ``last_event_id``; ``StopAsyncIteration`` when closed or the conversation is
        gone."""
        if self._closed:
            raise StopAsyncIteration
        opening = self._opening
        if opening is not None:  # the subscription made with the stream
            try:
                # shielded: a caller's timeout must not undo the subscription
                resp = await asyncio.shield(opening)
            except asyncio.CancelledError:
                if self._closed and opening.cancelled():
                    raise StopAsyncIteration from None
                raise
            self._opening = None
        else:
            resp = await self._connect(first=False)
        if resp is None or self._closed:  # the conversation is gone, or closed meanwhile
            if resp is not None:
                resp.close()
            self._closed = True
            raise StopAsyncIteration
        self._resp, self._buffer = resp, b""
        return resp

    @staticmethod
    def _parse(frame: bytes) -> tuple[int | None, Event | None]:
        """A frame's id and event (None: a comment such as ``: ping``, an id alone, or an
        event type this version does not know)."""
        if frame.startswith(b"id: "):  # the server's layout: "id: N\nevent: T\ndata: JSON"
            end = frame.find(b"\n")
            start = frame.find(b"\ndata: ", end)
            if end > 0 and start > 0 and frame.find(b"\n", start + 7) < 0:
                return int(frame[4:end]), event_from_json(json.loads(frame[start + 7 :]))
        seq: int | None = None
        data: list[bytes] = []  # any other layout the SSE format allows
        for line in frame.split(b"\n"):
            if line.startswith(b"data:"):
                data.append(line[6:] if line[5:6] == b" " else line[5:])
            elif line.startswith(b"id:"):
                seq = int(line[3:])
        return seq, event_from_json(json.loads(b"\n".join(data))) if data else None

    async def _connect(self, *, first: bool) -> aiohttp.ClientResponse | None:
        """The stream's response, from ``last_event_id``; None when the conversation is gone
        (a reconnect answered 404) or the stream was closed."""
        agent = self.agent
        retries = _Retries(agent, f"event stream {self.url}")
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=agent.timeout, sock_read=agent.stream_idle
        )
        while not self._closed:
            headers = {**agent._headers, "Accept": "text/event-stream"}
            if self.last_event_id is not None:
                headers["Last-Event-ID"] = str(self.last_event_id)
            try:
                resp = await agent.session.get(self.url, headers=headers, timeout=timeout)
            except NETWORK_ERRORS as e:
                failure: Exception = e
            else:
                if resp.status not in RETRYABLE_STATUS:
                    retries.succeeded()  # the server answered
                if resp.status == 200:
                    start = resp.headers.get("Last-Event-ID", "")
                    if self.last_event_id is None and start.isdigit():
                        self.last_event_id = int(start)  # resume from here if it drops early
                    return resp
                error = await _api_error(resp)
                resp.close()
                if error.status == 404 and not first:
                    return None
                if error.status not in RETRYABLE_STATUS:
                    raise error
                failure = error
            await retries.wait(failure)
        return None
