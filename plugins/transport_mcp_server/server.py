"""The agent as an MCP server (this module imports ``mcp``): five tools and one resource per
conversation, on the SDK's low-level ``Server``, served over streamable HTTP by the SDK's own
session manager (``docs/mcp_server.md``)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import jsonschema
import mcp_types as types
from mcp.server import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError

from agentik.core.agent import ChatAgent, ChatConversation, ConversationClosed
from agentik.core.store import utcnow
from agentik.core.types import (
    AppendText,
    End,
    InvalidInput,
    Message,
    TextPart,
    UnknownReference,
    Via,
)

log = logging.getLogger(__name__)

SCHEME = "agentik://conversations/"
PAGE = 100  # conversations per resources/list page
MAX_PAGE = 200  # messages or conversations a tool returns at most
HISTORY_PAGE = 500  # records read per query for a resource
MAX_ID = 200  # characters of a client's message id (it keys a durable send)
RESOURCE_NOT_FOUND = -32002  # MCP's code for an unknown resource
PROGRESS_LINGER = 0.05  # seconds a chat's progress waits after news to gather more text
VIA = Via("mcp")  # how its messages arrived, on their user records

ID = {"type": "string", "minLength": 1, "maxLength": 255}
CONVERSATION = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "title": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "createdAt": {"type": "string"},
        "updatedAt": {"type": "string"},
        "busy": {"type": "boolean"},
    },
    "required": ["id", "title", "createdAt", "updatedAt", "busy"],
}


def _tool(
    name: str,
    title: str,
    description: str,
    properties: dict[str, Any],
    required: list[str],
    output: dict[str, Any],
    **hints: bool,
) -> types.Tool:
    return types.Tool(
        name=name,
        title=title,
        description=description,
        input_schema={
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        },
        output_schema={"type": "object", **output},
        annotations=types.ToolAnnotations(title=title, **hints),
    )


TOOLS = [
    _tool(
        "chat",
        "Chat with the agent",
        "Send a message to the agent and get its reply. The agent keeps the conversation: pass "
        "the conversationId of the reply to continue it, or none to start a new one. The reply "
        "streams as progress notifications while the agent writes it.",
        {
            "text": {"type": "string", "minLength": 1, "description": "The message."},
            "conversationId": {**ID, "description": "The conversation to continue."},
            "messageId": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_ID,
                "description": "Your id for this message: the same call again with it (a retry) "
                "gets this message's reply, not a second turn.",
            },
        },
        ["text"],
        {
            "properties": {
                "conversationId": {"type": "string"},
                "reply": {"type": "string"},
                "status": {"enum": ["completed", "interrupted", "truncated"]},
            },
            "required": ["conversationId", "reply", "status"],
        },
        read_only_hint=False,
        destructive_hint=False,
        idempotent_hint=False,
        open_world_hint=True,  # the agent's own tools may reach anything
    ),
    _tool(
        "new_conversation",
        "New conversation",
        "Start an empty conversation with the agent and return its id.",
        {"title": {"type": "string", "maxLength": 1000}},
        [],
        {"properties": {"conversationId": {"type": "string"}}, "required": ["conversationId"]},
        read_only_hint=False,
        destructive_hint=False,
        idempotent_hint=False,
        open_world_hint=False,
    ),
    _tool(
        "list_conversations",
        "List conversations",
        "The agent's conversations, most recently updated first.",
        {
            "offset": {"type": "integer", "minimum": 0},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE},
        },
        [],
        {
            "properties": {"conversations": {"type": "array", "items": CONVERSATION}},
            "required": ["conversations"],
        },
        read_only_hint=True,
        open_world_hint=False,
    ),
    _tool(
        "get_messages",
        "Get messages",
        "A page of a conversation's history, oldest first: user and assistant messages, the "
        "agent's tool calls and results, errors.",
        {
            "conversationId": ID,
            "after": {"type": "string", "description": "A message id: the page starts after it."},
            "offset": {"type": "integer", "minimum": 0},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE},
        },
        ["conversationId"],
        {
            "properties": {"messages": {"type": "array", "items": {"type": "object"}}},
            "required": ["messages"],
        },
        read_only_hint=True,
        open_world_hint=False,
    ),
    _tool(
        "interrupt",
        "Interrupt",
        "Stop the agent's running turn in a conversation (its reply so far is kept). Messages "
        "queued behind it still run.",
        {"conversationId": ID},
        ["conversationId"],
        {"properties": {"interrupted": {"type": "boolean"}}, "required": ["interrupted"]},
        read_only_hint=False,
        destructive_hint=True,  # it cuts a reply short
        idempotent_hint=True,
        open_world_hint=False,
    ),
]
VALIDATORS = {t.name: jsonschema.Draft202012Validator(t.input_schema) for t in TOOLS}


class ToolFailed(Exception):
    """A tool's own failure: the caller (a model, often) sees it as an error result."""


def conversation_json(info: Any, busy: bool) -> dict[str, Any]:
    return {
        "id": info.id,
        "title": info.title,
        "createdAt": info.created_at.isoformat(),
        "updatedAt": info.updated_at.isoformat(),
        "busy": busy,
    }


class AgentTools:
    """What the MCP tools and resources do, on the agent's protocol."""

    def __init__(self, agent: ChatAgent) -> None:
        self.agent = agent
        self.calls: dict[str, Callable[..., Awaitable[tuple[str, dict[str, Any]]]]] = {
            "chat": self.chat,
            "new_conversation": self.new_conversation,
            "list_conversations": self.list_conversations,
            "get_messages": self.get_messages,
            "interrupt": self.interrupt,
        }

    async def _conversation(self, conversation_id: str) -> ChatConversation:
        conv = await self.agent.get_conversation(conversation_id)
        if conv is None:
            raise ToolFailed(f"no conversation {conversation_id!r}")
        return conv

    async def chat(
        self,
        ctx: ServerRequestContext[Any],
        text: str,
        conversationId: str | None = None,
        messageId: str | None = None,
    ) -> tuple[str, dict[str, Any]]:
        if conversationId is not None:
            conv = await self._conversation(conversationId)
        else:
            conv = await self.agent.create_conversation()
        after, started = conv.last_event_id, utcnow()
        key = f"mcp:{messageId}" if messageId else None
        try:
            msg = await conv.send([TextPart(text)], idempotency_key=key, via=VIA)
        except (InvalidInput, ConversationClosed) as e:
            raise ToolFailed(str(e)) from None
        wants_progress = bool(ctx.meta and ctx.meta.get("progress_token") is not None)
        if wants_progress and msg.created_at >= started:  # not a retry: its text as progress
            await self._progress(ctx, conv, msg, after)
        end = await conv.turn_end(msg.id)
        if end is None:
            raise ToolFailed(
                f"the server stopped before the reply was finished; it will be in conversation "
                f"{conv.id} (get_messages)"
            )
        if end.kind == "error":
            raise ToolFailed(f"the agent failed: {end.payload.get('message')} ({conv.id})")
        reply = end.payload.get("text", "")
        status = "completed"
        if end.payload.get("interrupted"):
            status = "interrupted"
        elif end.payload.get("truncated"):
            status = "truncated"
        return reply, {"conversationId": conv.id, "reply": reply, "status": status}

    async def _progress(
        self, ctx: ServerRequestContext[Any], conv: ChatConversation, msg: Message, after: int
    ) -> None:
        """The turn's text as progress notifications: each carries the text that came since the
        last in ``message``, ``progress`` counts the characters so far. At most one per
        ``PROGRESS_LINGER`` seconds: each one costs the SDK far more than an SSE event costs
        agentik, and a reader sees no difference at 20 a second."""
        written = 0
        batches = conv.turn_batches(msg.id, after, PROGRESS_LINGER)
        try:
            async for batch in batches:
                text = "".join(
                    i.event.text
                    for i in batch
                    if isinstance(i.event, AppendText) and not i.event.reasoning
                )
                if text:
                    written += len(text)
                    await ctx.session.report_progress(written, None, text)
                if any(isinstance(i.event, End) for i in batch):
                    return
        finally:
            await batches.aclose()

    async def new_conversation(
        self, ctx: ServerRequestContext[Any], title: str | None = None
    ) -> tuple[str, dict[str, Any]]:
        conv = await self.agent.create_conversation(title=title or None)
        return conv.id, {"conversationId": conv.id}

    async def list_conversations(
        self, ctx: ServerRequestContext[Any], offset: int = 0, limit: int = 50
    ) -> tuple[str, dict[str, Any]]:
        infos = await self.agent.list_conversations(offset, limit)
        busy = await self.agent.busy_among([i.id for i in infos])  # across instances too
        items = [conversation_json(i, i.id in busy) for i in infos]
        return json.dumps(items, ensure_ascii=False), {"conversations": items}

    async def get_messages(
        self,
        ctx: ServerRequestContext[Any],
        conversationId: str,
        after: str | None = None,
        offset: int = 0,
        limit: int = 50,
    ) -> tuple[str, dict[str, Any]]:
        conv = await self._conversation(conversationId)
        try:
            records = await conv.get_messages(after, offset, limit)
        except UnknownReference as e:
            raise ToolFailed(str(e)) from None
        items = [r.to_json() for r in records]
        return json.dumps(items, ensure_ascii=False), {"messages": items}

    async def interrupt(
        self, ctx: ServerRequestContext[Any], conversationId: str
    ) -> tuple[str, dict[str, Any]]:
        conv = await self._conversation(conversationId)
        stopped = await conv.ainterrupt()
        text = "interrupted the running turn" if stopped else "no turn was running"
        return text, {"interrupted": stopped}

    # --- resources ----------------------------------------------------------------------------

    async def resources(self, cursor: str | None) -> tuple[list[types.Resource], str | None]:
        offset = 0
        if cursor:
            if not (cursor.isascii() and cursor.isdigit() and len(cursor) < 10):
                raise MCPError(code=types.INVALID_PARAMS, message="not a cursor this server gave")
            offset = int(cursor)
        infos = await self.agent.list_conversations(offset, PAGE + 1)
        resources = [
            types.Resource(
                uri=SCHEME + info.id,
                name=info.id,
                title=info.title or None,
                description="The conversation's history as Markdown",
                mime_type="text/markdown",
                annotations=types.Annotations(last_modified=info.updated_at.isoformat()),
            )
            for info in infos[:PAGE]
        ]
        return resources, str(offset + PAGE) if len(infos) > PAGE else None

    async def read(self, uri: str) -> str:
        conv = None
        if uri.startswith(SCHEME) and "/" not in uri[len(SCHEME) :]:
            conv = await self.agent.get_conversation(uri[len(SCHEME) :])
        if conv is None:
            raise MCPError(
                code=RESOURCE_NOT_FOUND, message=f"no such resource: {uri}", data={"uri": uri}
            )
        records: list[Message] = []
        while True:
            page = await conv.get_messages(None, len(records), HISTORY_PAGE)
            records.extend(page)
            if len(page) < HISTORY_PAGE:
                return transcript(conv, records)


def transcript(conv: ChatConversation, records: list[Message]) -> str:
    """A conversation's history as Markdown, for a reader (person or model)."""
    lines = [f"# {conv.title or 'Conversation'} ({conv.id})", ""]
    for record in records:
        p = record.payload
        if record.kind == "user":
            text = "\n".join(part.get("body", "[image]") for part in p.get("content", []))
            lines += [f"**User** ({record.created_at.isoformat()}):", "", text, ""]
        elif record.kind == "assistant":
            mark = " (interrupted)" if p.get("interrupted") else ""
            lines += [f"**Assistant**{mark}:", "", p.get("text", ""), ""]
        elif record.kind == "tool_call":
            lines += [f"*Tool call* `{p.get('toolName')}` `{p.get('argsJson')}`", ""]
        elif record.kind == "tool_result":
            mark = "Tool error" if p.get("isError") else "Tool result"
            lines += [f"*{mark}*:", "", "```", p.get("text", ""), "```", ""]
        elif record.kind == "error":
            lines += [f"*Error*: {p.get('message')} ({p.get('code')})", ""]
        elif record.kind == "summary":
            lines += ["*Summary of the earlier turns*:", "", p.get("text", ""), ""]
    return "\n".join(lines)


def build_server(agent: ChatAgent, name: str, version: str, description: str) -> Server[Any]:
    tools = AgentTools(agent)

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        call = tools.calls.get(params.name)
        if call is None:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {params.name}")
        arguments = params.arguments or {}
        error = jsonschema.exceptions.best_match(VALIDATORS[params.name].iter_errors(arguments))
        try:
            if error is not None:
                where = ".".join(str(p) for p in error.absolute_path) or "arguments"
                raise ToolFailed(f"invalid arguments: {where}: {error.message}")
            text, structured = await call(ctx, **arguments)
        except ToolFailed as e:
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=str(e))], is_error=True
            )
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content=structured
        )

    async def list_resources(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        resources, cursor = await tools.resources(params.cursor if params else None)
        return types.ListResourcesResult(resources=resources, next_cursor=cursor)

    async def list_templates(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        template = types.ResourceTemplate(
            uri_template=SCHEME + "{id}",
            name="conversation",
            title="A conversation",
            description="A conversation's history as Markdown, by its id",
            mime_type="text/markdown",
        )
        return types.ListResourceTemplatesResult(resource_templates=[template])

    async def read_resource(
        ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        text = await tools.read(str(params.uri))
        contents = types.TextResourceContents(uri=params.uri, text=text, mime_type="text/markdown")
        return types.ReadResourceResult(contents=[contents])

    instructions = (
        f"{description}\n\nTalk to it with the chat tool: it answers and returns a "
        "conversationId; pass that id to continue the same conversation (the agent keeps its "
        "history). Each conversation is also a resource, agentik://conversations/{id}."
    )
    return Server(
        name,
        version=version,
        description=description,
        instructions=instructions,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
    )


def session_manager(server: Server[Any]) -> StreamableHTTPSessionManager:
    # the Host, Origin and key checks are the agentik app's own (agentik.core.security)
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return StreamableHTTPSessionManager(server, security_settings=security)
