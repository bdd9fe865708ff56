"""The A2A routes on the one aiohttp server: the JSON-RPC endpoint (with and without a trailing
slash) and the agent card (public: clients read it before they have a key)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging

from a2a.types import a2a_pb2 as pb
from a2a.utils import errors
from aiohttp import web

from agentik.core.agent import ChatAgent
from agentik.core.security import own_content_type, public
from agentik.core.settings import Settings
from agentik_transport_a2a import jsonrpc
from agentik_transport_a2a.card import agent_card, skills_version
from agentik_transport_a2a.jsonrpc import V03, V10, Call
from agentik_transport_a2a.service import TERMINAL, A2AService, TaskRun, Update

log = logging.getLogger(__name__)

STATE = "agentik_transport_a2a"  # agent.state key of the A2AService
MAX_PAGE = 100
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
CARD_CACHE = "public, max-age=300"


def json_response(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json")


class A2ARoutes:
    def __init__(self, agent: ChatAgent, settings: Settings, root: str) -> None:
        self.agent, self.settings, self.root = agent, settings, root
        self._cards: dict[tuple[str, int | None], tuple[bytes, str]] = {}

    def add_to(self, app: web.Application) -> None:
        app.router.add_post(self.root, self.rpc)
        app.router.add_post(self.root + "/", self.rpc)
        app.router.add_get(self.root + "/.well-known/agent-card.json", self.card)
        app.router.add_get("/.well-known/agent-card.json", self.card)

    @property
    def service(self) -> A2AService:
        service = self.agent.state.get(STATE)
        if service is None:
            raise errors.InternalError(message="A2A tasks need the SQLite store")
        return service  # type: ignore[no-any-return]

    # --- the agent card -----------------------------------------------------------------------

    @public
    async def card(self, request: web.Request) -> web.Response:
        base = f"{request.scheme}://{request.host}"
        key = (base, skills_version(self.settings))
        cached = self._cards.get(key)
        if cached is None:
            if len(self._cards) > 32:  # hosts are the client's to name: keep few
                self._cards.clear()
            card = agent_card(self.settings, base, self.root + "/")
            body = json.dumps(card, ensure_ascii=False, indent=2).encode()
            cached = self._cards[key] = (body, f'"{hashlib.sha256(body).hexdigest()[:32]}"')
        body, etag = cached
        headers = {"Cache-Control": CARD_CACHE, "ETag": etag}
        if etag in request.headers.get("If-None-Match", ""):
            return web.Response(status=304, headers=headers)
        return web.Response(body=body, content_type="application/json", headers=headers)

    # --- JSON-RPC -----------------------------------------------------------------------------

    @own_content_type
    async def rpc(self, request: web.Request) -> web.StreamResponse:
        ctype = request.content_type
        if ctype != "application/json" and not ctype.endswith("+json"):
            err = errors.ContentTypeNotSupportedError(
                message=f"the body must be JSON (Content-Type: application/json), got {ctype!r}"
            )
            return json_response(jsonrpc.error(None, err))
        try:
            data = json.loads(await request.read())
        except (ValueError, RecursionError) as e:
            return json_response(jsonrpc.error(None, _parse_error(e)))
        version = V10
        try:
            request_id, method, version = jsonrpc.envelope(data)
            try:
                jsonrpc.check_version(request.headers.get(jsonrpc.VERSION_HEADER), version)
            except errors.VersionNotSupportedError as e:  # 0.3 has no such code: answered in 1.0
                return json_response(jsonrpc.error(request_id, e))
            call = jsonrpc.parse_params(data, method, version)
            if call.method in jsonrpc.STREAMING:
                return await self._stream(request, call)
            return json_response(await self._answer(call))
        except errors.A2AError as e:
            return json_response(jsonrpc.error(jsonrpc.error_id(data), e, version))
        except Exception:
            log.exception("a2a: %s failed", data.get("method") if isinstance(data, dict) else "")
            err = errors.InternalError(message="internal error")
            return json_response(jsonrpc.error(jsonrpc.error_id(data), err, version))

    async def _answer(self, call: Call) -> bytes:
        method, params, service = call.method, call.params, self.service
        if method == "SendMessage":
            run = await service.send(params)
            if not params.configuration.return_immediately:
                await run.finished.wait()
            task = _history(run.snapshot()[0], params.configuration)
            if call.version == V03:
                return jsonrpc.result(call, jsonrpc.task_json(task, V03))
            return jsonrpc.result(call, {"task": jsonrpc.task_json(task, V10)})
        if method == "GetTask":
            return jsonrpc.result(call, jsonrpc.task_json(await service.get(params), call.version))
        if method == "CancelTask":
            task = await service.cancel(params)
            return jsonrpc.result(call, jsonrpc.task_json(task, call.version))
        if method == "ListTasks":
            response = await service.list(params, MAX_PAGE)
            return jsonrpc.result(call, jsonrpc.list_json(response, params.include_artifacts))
        if method in jsonrpc.PUSH:
            raise errors.PushNotificationNotSupportedError(
                message="push notifications are not supported"
            )
        raise errors.ExtendedAgentCardNotConfiguredError(
            message="this agent has no extended agent card"
        )

    async def _stream(self, request: web.Request, call: Call) -> web.StreamResponse:
        """Errors found before the stream starts are a plain JSON-RPC answer; then SSE: the task
        first, then its updates through its final status."""
        service = self.service
        run: TaskRun
        if call.method == "SendStreamingMessage":
            run = await service.send(call.params)
        else:
            run = await service.subscribe(call.params.id)
        task, start = run.snapshot()
        if call.method == "SendStreamingMessage":
            task = _history(task, call.params.configuration)
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        try:
            await response.write(jsonrpc.stream_frame(call, Update("task", task)))
            if task.status.state in TERMINAL:
                return response
            async for batch in run.follow(start):  # one write for all that came meanwhile
                frames, done = [], False
                for update in batch:
                    frames.append(jsonrpc.stream_frame(call, update))
                    if update.kind == "status_update" and update.value.status.state in TERMINAL:
                        done = True
                        break
                await response.write(b"".join(frames))
                if done:
                    break
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client left; the task goes on
        return response


def _history(task: pb.Task, configuration: pb.SendMessageConfiguration) -> pb.Task:
    from a2a.utils.task import apply_history_length

    return apply_history_length(task, configuration)


def _parse_error(e: Exception) -> errors.A2AError:
    err = errors.JSONParseError(message=f"invalid JSON: {e}")
    return err
