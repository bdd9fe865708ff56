"""B20's floor: a2a-sdk's own A2A server (its JSON-RPC routes on Starlette, served by uvicorn,
its DefaultRequestHandler and in-memory task store) with a trivial executor that relays the
fake LLM's stream as artifact updates, as agentik's A2A transport does.

    python bench/floors/a2a_reference.py --port P --upstream http://127.0.0.1:F/v1

Needs starlette, sse-starlette and uvicorn (installed with agentik[all], through mcp).
"""

from __future__ import annotations

import argparse
import json

import aiohttp
import uvicorn
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes.agent_card_routes import create_agent_card_routes
from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import a2a_pb2 as pb
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route


class Relay(AgentExecutor):
    """The user's text to the OpenAI-compatible upstream, its deltas back as one artifact."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.session: aiohttp.ClientSession | None = None

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        if self.session is None:
            self.session = aiohttp.ClientSession()
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        if context.current_task is None:  # the handler wants the Task before any update
            task = pb.Task(
                id=updater.task_id,
                context_id=updater.context_id,
                status=pb.TaskStatus(state=pb.TASK_STATE_SUBMITTED),
            )
            if context.message is not None:
                task.history.append(context.message)
            await event_queue.enqueue_event(task)
        await updater.start_work()
        body = {
            "model": "fake-model",
            "stream": True,
            "messages": [{"role": "user", "content": context.get_user_input()}],
        }
        first = True
        async with self.session.post(f"{self.upstream}/chat/completions", json=body) as r:
            async for line in r.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                choices = json.loads(line[6:]).get("choices") or []
                text = choices[0].get("delta", {}).get("content") if choices else None
                if text:
                    await updater.add_artifact(
                        [pb.Part(text=text)], artifact_id="reply", name="reply", append=not first
                    )
                    first = False
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    url = f"http://127.0.0.1:{args.port}/a2a/"
    card = pb.AgentCard(
        name="reference",
        description="a2a-sdk reference relay",
        version="1",
        supported_interfaces=[
            pb.AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=pb.AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
    )
    handler = DefaultRequestHandler(
        agent_executor=Relay(args.upstream), task_store=InMemoryTaskStore(), agent_card=card
    )

    async def health(request: object) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    routes = [
        Route("/health", health),
        *create_jsonrpc_routes(handler, "/a2a/"),
        *create_agent_card_routes(card, card_url="/a2a/.well-known/agent-card.json"),
    ]
    uvicorn.run(Starlette(routes=routes), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
