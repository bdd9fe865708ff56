"""A stdio MCP server (the mcp SDK's) whose one tool answers the ``_meta`` its call carried:
the tests see the traceparent a tool call sends."""

from __future__ import annotations

import json

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("meta")


@server.tool()
def call_meta(ctx: Context) -> str:
    """The _meta of this call, as JSON."""
    return json.dumps(dict(ctx.request_context.meta or {}))


if __name__ == "__main__":
    server.run("stdio")
