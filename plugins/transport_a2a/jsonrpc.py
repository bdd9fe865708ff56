"""The JSON-RPC binding of A2A: the envelope, the method names and params of 1.0 and 0.3, the
``A2A-Version`` rules, the error table, and each version's JSON of results and stream events.

Errors are a2a-sdk's ``A2AError`` classes with its code map: the 1.0 answer carries a
``google.rpc.ErrorInfo`` in ``error.data`` (``build_error_details``); the 0.3 answer is shaped as
0.3 clients expect (the code, the message and the error's own data), as a2a-sdk's 0.3 adapter does.
"""

from __future__ import annotations

import json
from typing import Any

from a2a.types import a2a_pb2 as pb
from a2a.utils import errors
from a2a.utils.error_handlers import build_error_details
from google.protobuf.json_format import MessageToDict, ParseDict
from packaging.version import InvalidVersion, Version

from agentik_transport_a2a.card import VERSION_HEADER as VERSION_HEADER
from agentik_transport_a2a.service import Update

V10, V03 = "1.0", "0.3"

REQUESTS_10: dict[str, type[Any]] = {
    "SendMessage": pb.SendMessageRequest,
    "SendStreamingMessage": pb.SendMessageRequest,
    "GetTask": pb.GetTaskRequest,
    "ListTasks": pb.ListTasksRequest,
    "CancelTask": pb.CancelTaskRequest,
    "SubscribeToTask": pb.SubscribeToTaskRequest,
    "CreateTaskPushNotificationConfig": pb.TaskPushNotificationConfig,
    "GetTaskPushNotificationConfig": pb.GetTaskPushNotificationConfigRequest,
    "ListTaskPushNotificationConfigs": pb.ListTaskPushNotificationConfigsRequest,
    "DeleteTaskPushNotificationConfig": pb.DeleteTaskPushNotificationConfigRequest,
    "GetExtendedAgentCard": pb.GetExtendedAgentCardRequest,
}
#: 0.3 names -> the 1.0 operation they are
NAMES_03 = {
    "message/send": "SendMessage",
    "message/stream": "SendStreamingMessage",
    "tasks/get": "GetTask",
    "tasks/cancel": "CancelTask",
    "tasks/resubscribe": "SubscribeToTask",
    "tasks/pushNotificationConfig/set": "CreateTaskPushNotificationConfig",
    "tasks/pushNotificationConfig/get": "GetTaskPushNotificationConfig",
    "tasks/pushNotificationConfig/list": "ListTaskPushNotificationConfigs",
    "tasks/pushNotificationConfig/delete": "DeleteTaskPushNotificationConfig",
    "agent/getAuthenticatedExtendedCard": "GetExtendedAgentCard",
}
STREAMING = frozenset({"SendStreamingMessage", "SubscribeToTask"})
PUSH = frozenset(
    {
        "CreateTaskPushNotificationConfig",
        "GetTaskPushNotificationConfig",
        "ListTaskPushNotificationConfigs",
        "DeleteTaskPushNotificationConfig",
    }
)
V03_CODES = frozenset({-32700, -32600, -32601, -32602, -32603, *range(-32007, -32000)})


class Call:
    """One parsed JSON-RPC request: its id, the 1.0 operation and its params as a 1.0 proto."""

    __slots__ = ("id", "id_json", "method", "params", "version")

    def __init__(self, request_id: Any, method: str, version: str, params: Any = None) -> None:
        self.id = request_id
        self.id_json = json.dumps(request_id).encode()
        self.method, self.version, self.params = method, version, params


def envelope(data: Any) -> tuple[Any, str, str]:
    """(id, method name as sent, version of that name) of a request object, or an A2AError
    whose answer has ``error_id(data)`` as its id."""
    if isinstance(data, list):
        raise errors.InvalidRequestError(message="batch requests are not supported")
    if not isinstance(data, dict):
        raise errors.InvalidRequestError(message="the request must be a JSON object")
    request_id = data.get("id")
    if "id" not in data:
        raise errors.InvalidRequestError(message="id is required (notifications are not served)")
    if isinstance(request_id, bool) or not isinstance(request_id, str | int | None):
        raise errors.InvalidRequestError(message="id must be a string, an integer or null")
    if data.get("jsonrpc") != "2.0":
        raise errors.InvalidRequestError(message="'jsonrpc' must be exactly '2.0'")
    method = data.get("method")
    if not isinstance(method, str) or not method:
        raise errors.InvalidRequestError(message="method must be a non-empty string")
    if method in REQUESTS_10:
        return request_id, method, V10
    if method in NAMES_03:
        return request_id, method, V03
    raise errors.MethodNotFoundError(message=f"method {method[:100]!r} not found")


def error_id(data: Any) -> Any:
    """The id to answer a bad request with: its own when it is a valid one, else null."""
    if isinstance(data, dict):
        rid = data.get("id")
        if not isinstance(rid, bool) and isinstance(rid, str | int):
            return rid
    return None


def check_version(header: str | None, version: str) -> None:
    """``A2A-Version`` (absent or empty: 0.3) must have the major version of the method's."""
    asked = (header or "").strip() or V03
    try:
        major = Version(asked).major
    except InvalidVersion:
        major = None
    if major != Version(version).major:
        raise errors.VersionNotSupportedError(
            message=f"A2A version {asked[:20]!r} is not supported by this method "
            f"(it is of version {version}; this server speaks 1.0 and 0.3)"
        )


def parse_params(data: dict[str, Any], method: str, version: str) -> Call:
    """The call's params as the 1.0 request proto (0.3 params converted by a2a-sdk's compat)."""
    params = data.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise errors.InvalidParamsError(message="params must be an object")
    if version == V10:
        try:
            proto = ParseDict(params, REQUESTS_10[method](), ignore_unknown_fields=True)
        except Exception as e:
            raise errors.InvalidParamsError(message=f"invalid params: {e}") from None
        return Call(data["id"], method, version, proto)
    operation = NAMES_03[method]
    if operation not in ("SendMessage", "SendStreamingMessage", "GetTask", "CancelTask",
                         "SubscribeToTask"):  # fmt: skip
        return Call(data["id"], operation, version)
    from agentik_transport_a2a import compat03

    return Call(data["id"], operation, version, compat03.parse(method, data))


# --- answers ------------------------------------------------------------------------------


def _dumps(value: Any) -> bytes:
    # "replace": a model's broken surrogate pair must not break the stream
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")


_string = json.JSONEncoder(ensure_ascii=False).encode  # one JSON string, C-fast


def result(call: Call, value: Any) -> bytes:
    return _wrap(call, _dumps(value))


def _wrap(call: Call, result_json: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":' + call.id_json + b',"result":' + result_json + b"}"


def error(request_id: Any, err: errors.A2AError, version: str = V10) -> bytes:
    code = errors.JSON_RPC_ERROR_CODE_MAP.get(type(err), -32603)
    body: dict[str, Any] = {"code": code, "message": err.message}
    if version == V03:
        if code not in V03_CODES:
            body["code"] = -32603
        if err.data is not None:
            body["data"] = err.data
    else:
        body["data"] = build_error_details(err)
    return _dumps({"jsonrpc": "2.0", "id": request_id, "error": body})


def task_json(task: pb.Task, version: str) -> Any:
    if version == V10:
        return MessageToDict(task)
    from agentik_transport_a2a import compat03

    return compat03.task(task)


def list_json(response: pb.ListTasksResponse, include_artifacts: bool) -> Any:
    out = MessageToDict(response)
    # the page's own fields always, even when empty or zero (the tasks as usual)
    out.setdefault("tasks", [])
    out.setdefault("nextPageToken", "")
    out.setdefault("pageSize", response.page_size)
    out.setdefault("totalSize", response.total_size)
    if not include_artifacts:
        for task in out["tasks"]:
            task.pop("artifacts", None)
    return out


def stream_frame(call: Call, update: Update) -> bytes:
    """One SSE event: the JSON-RPC response carrying ``update``; the update's JSON is made once
    per version for every listener."""
    encoded = update.memo.get(call.version)
    if encoded is None:
        encoded = update.memo[call.version] = _update_json(update, call.version)
    return b"data: " + _wrap(call, encoded) + b"\n\n"


def _update_json(update: Update, version: str) -> bytes:
    if update.kind == "artifact_update":
        return _artifact_json(*update.value, version)
    if version == V10:
        return _dumps(MessageToDict(pb.StreamResponse(**{update.kind: update.value})))
    from agentik_transport_a2a import compat03

    if update.kind == "task":
        return _dumps(compat03.task(update.value))
    return _dumps(compat03.status_update(update.value))


def _artifact_json(
    task_id: str, context_id: str, text: str, append: bool, last: bool, version: str
) -> bytes:
    """One chunk of the reply: the hot path (one a text delta), so written without protobuf or
    a nested ``json.dumps``; the same JSON as ``MessageToDict`` (1.0) or the 0.3 model gives."""
    ids = f'"taskId":{_string(task_id)},"contextId":{_string(context_id)}'
    if version == V10:
        part = f'{{"text":{_string(text)}}}'
        # as MessageToDict writes them: a flag only when it is true
        flags = (',"append":true' if append else "") + (',"lastChunk":true' if last else "")
        return (
            f'{{"artifactUpdate":{{{ids},"artifact":{{"artifactId":"reply","name":"reply",'
            f'"parts":[{part}]}}{flags}}}}}'
        ).encode("utf-8", "replace")
    part = f'{{"kind":"text","text":{_string(text)}}}'
    flags = f'"append":{"true" if append else "false"},"lastChunk":{"true" if last else "false"}'
    return (
        f'{{"kind":"artifact-update",{ids},"artifact":{{"artifactId":"reply","name":"reply",'
        f'"parts":[{part}]}},{flags}}}'
    ).encode("utf-8", "replace")
