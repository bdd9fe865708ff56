"""A2A 0.3 shapes through a2a-sdk's compat layer (imported at the first 0.3 call: its pydantic
models take a while to load)."""

from __future__ import annotations

from typing import Any

from a2a.compat.v0_3 import conversions
from a2a.compat.v0_3 import types as v03
from a2a.types import a2a_pb2 as pb
from a2a.utils import errors
from pydantic import ValidationError

REQUESTS: dict[str, Any] = {
    "message/send": (v03.SendMessageRequest, conversions.to_core_send_message_request),
    "message/stream": (v03.SendStreamingMessageRequest, conversions.to_core_send_message_request),
    "tasks/get": (v03.GetTaskRequest, conversions.to_core_get_task_request),
    "tasks/cancel": (v03.CancelTaskRequest, conversions.to_core_cancel_task_request),
    "tasks/resubscribe": (
        v03.TaskResubscriptionRequest,
        conversions.to_core_subscribe_to_task_request,
    ),
}


def parse(method: str, data: dict[str, Any]) -> Any:
    """The 1.0 request proto of a 0.3 request object."""
    model, to_core = REQUESTS[method]
    try:
        return to_core(model.model_validate(data))
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()[:5]
        )
        raise errors.InvalidParamsError(message=f"invalid params: {problems}") from None
    except Exception as e:
        raise errors.InvalidParamsError(message=f"invalid params: {e}") from None


def _dump(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def task(value: pb.Task) -> Any:
    return _dump(conversions.to_compat_task(value))


def status_update(value: pb.TaskStatusUpdateEvent) -> Any:
    event = conversions.to_compat_task_status_update_event(value)
    if value.status.state == pb.TASK_STATE_INPUT_REQUIRED:
        event.final = True  # 0.3: the stream ends there, the client answers in a new request
    return _dump(event)
