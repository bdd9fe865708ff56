"""``GET /v1/models`` and ``POST /v1/chat/completions``: the agent as one OpenAI model.

A request sends only its new (last) user message to a conversation of the agent: the one the
``X-Agentik-Conversation-Id`` header names, else the one whose history its earlier messages
repeat (:mod:`agentik_transport_openai.threads`), else a new one. The reply is that turn, as one
``chat.completion`` or streamed as ``chat.completion.chunk`` events. A client that goes away
does not stop the turn; what continues the conversation is settled when the turn ends, by the
request or, when it left, by a background job.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from agentik.core.agent import ChatAgent, ChatConversation, ConversationClosed
from agentik.core.security import own_content_type
from agentik.core.types import (
    AppendText,
    End,
    InvalidInput,
    Message,
    MessageContext,
    ToolCall,
    ToolResult,
    Via,
)
from agentik_transport_openai import STATE
from agentik_transport_openai.request import (
    EMPTY,
    ChatRequest,
    OpenAIError,
    chain,
    normalise,
    parse,
    system_digest,
)
from agentik_transport_openai.threads import Claim, Sent, ThreadStore

VIA = Via("openai")  # how its messages arrived, on their user records

log = logging.getLogger(__name__)


HEADER = "X-Agentik-Conversation-Id"
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
DONE = b"data: [DONE]\n\n"
RESULT_PREVIEW = 300  # characters of a tool's result shown as reasoning
STOPPED = "the server stopped before the turn ended; its reply will be in the conversation"


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class OpenAIRoutes:
    def __init__(self, agent: ChatAgent, model_id: str, show_tools: bool) -> None:
        self.agent, self.model_id, self.show_tools = agent, model_id, show_tools
        self.created = int(time.time())

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model}", self.model)
        app.router.add_post("/v1/chat/completions", self.chat)

    @property
    def threads(self) -> ThreadStore | None:
        return self.agent.state.get(STATE)

    # --- models -------------------------------------------------------------------------------

    def _model(self) -> dict[str, Any]:
        return {
            "id": self.model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "agentik",
        }

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model()]})

    async def model(self, request: web.Request) -> web.Response:
        if request.match_info["model"] != self.model_id:
            name = request.match_info["model"]
            return OpenAIError(
                404, f"The model {name!r} does not exist", "model_not_found", "model"
            ).response()
        return web.json_response(self._model())

    # --- chat completions ---------------------------------------------------------------------

    @own_content_type
    async def chat(self, request: web.Request) -> web.StreamResponse:
        if request.content_type != "application/json":
            return OpenAIError(
                415, "the body must be JSON (Content-Type: application/json)",
                "unsupported_media_type",
            ).response()  # fmt: skip
        try:
            req = parse(await request.read(), self.model_id)
            conv, sent, after, retry = await self._send(request, req)
        except OpenAIError as e:
            return e.response()
        turn = Turn(self, conv, sent, after, retry)
        try:
            if req.stream:
                return await turn.stream(request, req.include_usage)
            return await turn.complete()
        finally:
            if not turn.settled:  # the client left before the end: settled when it comes
                self.agent.jobs.spawn(f"openai: settle {sent.turn_id}", turn.settle())

    async def _send(
        self, request: web.Request, req: ChatRequest
    ) -> tuple[ChatConversation, Sent, int, bool]:
        """The conversation and what was sent to it: ``(conversation, sent, event id to follow
        the turn after, True when this request was sent before)``."""
        threads = self.threads
        named = request.headers.get(HEADER)
        conv: ChatConversation | None = None
        claim: Claim | None = None
        again = await threads.retry_of(req.request_digest) if threads and req.prior else None
        if named:
            conv = await self.agent.get_conversation(named)
            if conv is None or conv.is_temporal:
                raise OpenAIError(
                    404, f"no conversation {named!r} ({HEADER})", "conversation_not_found"
                )
            if again is not None and again.conversation_id == conv.id:
                return conv, again, conv.last_event_id, True
            claim = await threads.take(conv.id) if threads else None
        elif again is not None:
            conv = await self.agent.get_conversation(again.conversation_id)
            if conv is not None:
                return conv, again, conv.last_event_id, True
        if conv is None and threads and req.prior:
            claim = await threads.claim(req.prior_digest)
            if claim is None:
                claim = await self._cut_short(threads, req)
            conv = await self.agent.get_conversation(claim.conversation_id) if claim else None
        created = conv is None
        if conv is None:
            claim = None
            conv = await self.agent.create_conversation()
        last = claim.last if claim is not None else None
        system = system_digest(req.system) if req.system else None
        context = None
        if req.system and (last is None or last.system != system):
            # F4: the client's instructions reach the model with the message, once per change
            context = MessageContext(origin="system", description=req.system)
        after = conv.last_event_id
        try:
            msg = await conv.send(req.content, context, via=VIA)
        except (InvalidInput, ConversationClosed) as e:
            if created:  # refused: nothing stays behind
                await self.agent.delete_conversation(conv.id)
            elif claim is not None and threads is not None:
                await threads.release(claim)
            if isinstance(e, ConversationClosed):
                raise OpenAIError(409, str(e), "conversation_closed") from None
            raise OpenAIError(400, str(e), "invalid_value", "messages") from None
        sent = Sent(
            conv.id,
            req.request_digest,
            req.prior_digest,
            msg.id,
            system or (last.system if last is not None else None),
        )
        if threads is not None:
            await threads.record(sent)
        return conv, sent, after, False

    async def _cut_short(self, threads: ThreadStore, req: ChatRequest) -> Claim | None:
        """The conversation whose last reply the client has only the start of (it stopped
        reading: a front end's stop button; the turn ran on to its end): its earlier messages
        are the ones of the last request sent there, and its last one begins that reply."""
        if len(req.prior) < 2 or req.prior[-1][0] != "assistant" or not req.prior[-1][1]:
            return None
        sent = await threads.retry_of(chain(EMPTY, req.prior[:-1]))
        conv = await self.agent.get_conversation(sent.conversation_id) if sent else None
        if sent is None or conv is None:
            return None
        end = await conv.turn_end(sent.turn_id)  # a reply still running: when it ends
        if end is None or end.kind != "assistant":
            return None
        if not normalise(end.payload.get("text", "")).startswith(req.prior[-1][1]):
            return None
        return await threads.take_if(conv.id, sent.turn_id)  # unless another request has it


class Turn:
    """One request's turn, answered whole (:meth:`complete`) or streamed (:meth:`stream`)."""

    def __init__(
        self, routes: OpenAIRoutes, conv: ChatConversation, sent: Sent, after: int, retry: bool
    ) -> None:
        self.routes, self.conv, self.sent, self.after, self.retry = routes, conv, sent, after, retry
        self.agent = routes.agent
        self.settled = retry  # a retry's turn is settled by the request that sent it
        self.headers = {HEADER: conv.id}
        self.id = f"chatcmpl-{sent.turn_id}"
        self.created = int(time.time())

    async def end(self, on_batch: Callable[[list[Any]], Any]) -> Message | None:
        """Follow the turn to its end (``on_batch`` gets its events as they come; a retry's
        turn is only waited for: its first events are gone) and settle the conversation;
        returns the record that ended the turn, None when the server stopped first."""
        if self.retry:
            return await self.settle()
        items = self.conv.turn_batches(self.sent.turn_id, self.after)
        try:
            async for batch in items:
                events = [item.event for item in batch]
                await on_batch(events)
                if any(isinstance(e, End) for e in events):
                    break
        finally:
            await items.aclose()
        return await self.settle()

    async def settle(self) -> Message | None:
        """Once the turn has ended (at once when it has): what continues its conversation now;
        returns the record that ended it, None when the server stopped first."""
        end = await self.conv.turn_end(self.sent.turn_id)
        threads = self.routes.threads
        if end is not None and not self.retry:
            if threads is not None:
                await threads.settle(self.sent, end)
            self.settled = True
        return end

    # --- one answer ---------------------------------------------------------------------------

    async def complete(self) -> web.Response:
        reasoning = Reasoning(self.routes.show_tools)

        async def collect(events: list[Any]) -> None:
            reasoning.feed(events)

        end = await self.end(collect)
        if end is None or end.kind == "error":
            return self._failure(end).response(self.headers)
        message: dict[str, Any] = {"role": "assistant", "content": end.payload.get("text", "")}
        if reasoning.text:
            message["reasoning_content"] = "".join(reasoning.text)
        message["refusal"] = None
        body = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.routes.model_id,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": finish_reason(end),
                }
            ],
            "usage": usage(end),
            "system_fingerprint": None,
        }
        return web.json_response(body, headers=self.headers, dumps=dumps)

    def _failure(self, end: Message | None) -> OpenAIError:
        if end is None:
            return OpenAIError(503, STOPPED, "shutdown", kind="server_error")
        code = end.payload.get("code") or "turn_failed"
        message = end.payload.get("message") or "the turn failed"
        return OpenAIError(502, message, code, kind="server_error")

    # --- a stream -----------------------------------------------------------------------------

    async def stream(self, request: web.Request, include_usage: bool) -> web.StreamResponse:
        response = web.StreamResponse(headers={**SSE_HEADERS, **self.headers})
        await response.prepare(request)
        chunks = Chunks(self.id, self.created, self.routes.model_id)
        deltas = Deltas(self.routes.show_tools)
        try:
            await response.write(chunks.delta("content", "", role=True))

            async def write(events: list[Any]) -> None:
                out = deltas.feed(events)
                if out:
                    await response.write(b"".join(chunks.delta(f, t) for f, t in out))

            end = await self.end(write)
            if end is None or end.kind == "error":
                body = self._failure(end).body()
                await response.write(f"data: {dumps(body)}\n\n".encode())
                return response
            tail = []
            if self.retry and end.payload.get("text"):  # a retry gets the reply at once
                tail.append(chunks.delta("content", end.payload["text"]))
            tail.append(chunks.finish(finish_reason(end)))
            if include_usage:
                tail.append(chunks.usage(usage(end)))
            tail.append(DONE)
            await response.write(b"".join(tail))
        except ConnectionError:
            pass  # the client left; the turn goes on and is settled by a job
        return response


def finish_reason(end: Message) -> str:
    return "length" if end.payload.get("truncated") else "stop"


def usage(end: Message) -> dict[str, int]:
    """The turn's token counts (0 where the backend could not count)."""
    tokens = end.payload.get("tokens") or {}
    prompt, completion = tokens.get("input") or 0, tokens.get("output") or 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


class Deltas:
    """A turn's events as the text of ``content`` and ``reasoning_content`` deltas: the reply
    text; the model's reasoning; with ``show_tools`` the agent's tool calls and results too.
    Consecutive deltas of one field are joined (one chunk each, fewer to encode)."""

    def __init__(self, show_tools: bool) -> None:
        self.show_tools = show_tools

    def feed(self, events: list[Any]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for event in events:
            item = self.delta(event)
            if item is None or not item[1]:
                continue
            if out and out[-1][0] == item[0]:
                out[-1] = (item[0], out[-1][1] + item[1])
            else:
                out.append(item)
        return out

    def delta(self, event: Any) -> tuple[str, str] | None:
        if isinstance(event, AppendText):
            return ("reasoning_content" if event.reasoning else "content", event.text)
        if not self.show_tools:
            return None
        if isinstance(event, ToolCall):
            return ("reasoning_content", f"\n[tool call] {event.tool_name} {event.args_json}\n")
        if isinstance(event, ToolResult):
            text = " ".join(event.text.split())
            if len(text) > RESULT_PREVIEW:
                text = text[: RESULT_PREVIEW - 1] + "…"
            mark = "tool error" if event.is_error else "tool result"
            return ("reasoning_content", f"[{mark}] {text}\n")
        return None  # StartResponse, Error, End…: the end record says how the turn ended


class Reasoning:
    """The ``reasoning_content`` of an answer given whole."""

    def __init__(self, show_tools: bool) -> None:
        self.deltas = Deltas(show_tools)
        self.text: list[str] = []

    def feed(self, events: list[Any]) -> None:
        self.text += [t for field, t in self.deltas.feed(events) if field == "reasoning_content"]


class Chunks:
    """``chat.completion.chunk`` events of one completion, from a prefix encoded once."""

    def __init__(self, completion_id: str, created: int, model: str) -> None:
        self.head = (
            f'data: {{"id":{dumps(completion_id)},"object":"chat.completion.chunk",'
            f'"created":{created},"model":{dumps(model)},"system_fingerprint":null,"choices":'
        )

    def delta(self, field: str, text: str, role: bool = False) -> bytes:
        delta = (
            f'{{"role":"assistant","{field}":{dumps(text)}}}'
            if role
            else (f'{{"{field}":{dumps(text)}}}')
        )
        body = f'[{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":null}}]}}\n\n'
        # "replace": a model's broken surrogate pair must not break the stream
        return (self.head + body).encode("utf-8", "replace")

    def finish(self, reason: str) -> bytes:
        body = f'[{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":"{reason}"}}]}}\n\n'
        return (self.head + body).encode()

    def usage(self, counts: dict[str, int]) -> bytes:
        return (self.head + f'[],"usage":{dumps(counts)}}}\n\n').encode()
