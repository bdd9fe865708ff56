"""The JSON-RPC endpoint of A2A on aiohttp: one request in, a JSON-RPC answer or an SSE stream
out (imported at the first call: it loads a2a-sdk)."""

from __future__ import annotations

import contextlib
import logging

from a2a.utils import errors
from a2a.utils.task import apply_history_length
from aiohttp import web

from agentik.core.agent import ChatAgent
from agentik.core.types import InvalidInput, parse_json
from agentik_transport_a2a import jsonrpc
from agentik_transport_a2a.jsonrpc import V03, V10, Call
from agentik_transport_a2a.service import SETTLED, TERMINAL, A2AService, TaskRun, Update
from agentik_transport_a2a.tasks import Tasks

log = logging.getLogger(__name__)

STATE = "agentik_transport_a2a"  # agent.state key of the Tasks
MAX_PAGE = 100
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


def json_response(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json")


def service_of(agent: ChatAgent) -> A2AService:
    tasks: Tasks | None = agent.state.get(STATE)
    if tasks is None:
        raise errors.InternalError(message="A2A tasks need the SQLite store")
    return tasks.service()


async def handle(request: web.Request, agent: ChatAgent) -> web.StreamResponse:
    """Answer one JSON-RPC request: a JSON response, or an SSE stream for the streaming methods.
    Every failure is a JSON-RPC error (HTTP 200), never a 500."""
    ctype = request.content_type
    if ctype != "application/json" and not ctype.endswith("+json"):
        err = errors.ContentTypeNotSupportedError(
            message=f"the body must be JSON (Content-Type: application/json), got {ctype!r}"
        )
        return json_response(jsonrpc.error(None, err))
    try:
        # refused at the door, like every transport's bodies: NaN, 1e999 (a number no JSON
        # reader takes back), lone surrogates; never stored, no turn run
        data = parse_json(await request.read())
    except InvalidInput as e:
        return json_response(jsonrpc.error(None, errors.JSONParseError(message=str(e))))
    version = V10
    try:
        request_id, method, version = jsonrpc.envelope(data)
        try:
            jsonrpc.check_version(request.headers.get(jsonrpc.VERSION_HEADER), version)
        except errors.VersionNotSupportedError as e:  # 0.3 has no such code: answered in 1.0
            return json_response(jsonrpc.error(request_id, e))
        call = jsonrpc.parse_params(data, method, version)
        if call.method in jsonrpc.STREAMING:
            return await _stream(request, service_of(agent), call)
        return json_response(await _answer(service_of(agent), call))
    except errors.A2AError as e:
        return json_response(jsonrpc.error(jsonrpc.error_id(data), e, version))
    except Exception:
        log.exception("a2a: %s failed", data.get("method") if isinstance(data, dict) else "")
        err = errors.InternalError(message="internal error")
        return json_response(jsonrpc.error(jsonrpc.error_id(data), err, version))


async def _answer(service: A2AService, call: Call) -> bytes:
    method, params = call.method, call.params
    if method == "SendMessage":
        run = await service.send(params)
        if not params.configuration.return_immediately:
            await run.settled()  # ended, or waiting for this client's answer
        task = apply_history_length(run.snapshot()[0], params.configuration)
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


async def _stream(request: web.Request, service: A2AService, call: Call) -> web.StreamResponse:
    """Errors found before the stream starts are a plain JSON-RPC answer; then SSE: the task
    first, then its updates through its final status, or through ``INPUT_REQUIRED`` (the
    client answers with a message in the task, whose stream goes on from there)."""
    run: TaskRun
    if call.method == "SendStreamingMessage":
        run = await service.send(call.params)
    else:
        run = await service.subscribe(call.params.id)
    task, start = (
        run.first if run.first and call.method == "SendStreamingMessage" else run.snapshot()
    )
    if call.method == "SendStreamingMessage":
        task = apply_history_length(task, call.params.configuration)
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    try:
        await response.write(jsonrpc.stream_frame(call, Update("task", task)))
        state = task.status.state
        if state in TERMINAL or (state in SETTLED and call.method == "SendStreamingMessage"):
            return response
        async with contextlib.aclosing(run.follow(start)) as updates:
            async for batch in updates:  # one write for all that came meanwhile
                frames, done = [], False
                for update in batch:
                    frames.append(jsonrpc.stream_frame(call, update))
                    if update.kind == "status_update" and update.value.status.state in SETTLED:
                        done = True
                        break
                await response.write(b"".join(frames))
                if done:
                    break
    except ConnectionError:
        pass  # the client left; the task goes on
    return response
