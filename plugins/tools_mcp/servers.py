"""The MCP servers of ``mcp.json`` as agentik tools (this module imports ``mcp``).

Each connection to a server is owned by one asyncio task that enters the ``mcp.Client``, lists
the tools, and holds the session open until it is told to stop: anyio's task groups inside the
client must be entered and left by the same task, and start-up, tool calls and shutdown run in
different ones. Tool calls from any task go through the shared session (the SDK matches
answers to requests by id), so calls to one server run concurrently.

Failures never escape as exceptions from a tool: they become :class:`ToolError` (the model sees
``Error: …``). A connection that ends (a stdio server that exited or was killed, an HTTP
server that went away) marks the server down; its next call starts a new connection, at once
the first time, then with a doubling back-off while restarts keep failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import Implementation
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT
from pydantic import ValidationError

import agentik
from agentik.core.observe import trace_headers
from agentik.core.tools import Tool, ToolError, ToolSpec
from agentik_tools_mcp import config as cfg
from agentik_tools_mcp.names import exposed_name, valid
from agentik_tools_mcp.results import result_text

log = logging.getLogger("agentik_tools_mcp")

PLUGIN = "agentik_tools_mcp"
#: seconds a connection may take to close (stdio: stdin closed, SIGTERM after 2 s, SIGKILL
#: after 2 more, all inside the SDK) before its task is cancelled
CLOSE_TIMEOUT = 10.0
HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)  # the SDK's defaults for its own clients
CLIENT_INFO = Implementation(name="agentik", version=agentik.__version__)


class MCPTools:
    """Every server of one config: started together, their tools, closed together."""

    def __init__(
        self,
        servers: list[cfg.ServerConfig],
        skipped: Mapping[str, str] | None = None,
        *,
        start_timeout: float = 30.0,
        call_timeout: float = 60.0,
        backoff: tuple[float, float] = (1.0, 60.0),
    ) -> None:
        self.servers = [
            MCPServer(c, start_timeout=start_timeout, call_timeout=call_timeout, backoff=backoff)
            for c in servers
        ]
        #: servers left out, by name: malformed entries and servers that did not start
        self.failed: dict[str, str] = dict(skipped or {})
        self.tools: list[Tool] = []
        self.source: Path | None = None  # the config file they come from (for the banner)
        for name, why in self.failed.items():
            log.warning("mcp: server %r skipped: %s", name, why)

    @classmethod
    def from_file(cls, path: Path, env: Mapping[str, str], **kwargs: Any) -> MCPTools:
        servers, skipped = cfg.load(path, env)
        tools = cls(servers, skipped, **kwargs)
        tools.source = path
        return tools

    async def start(self, taken: Collection[str] = ()) -> list[Tool]:
        """Start every server in parallel; return the tools of those that started."""
        await asyncio.gather(*(s.start() for s in self.servers))
        names = set(taken)
        for server in self.servers:
            if server.state == "failed":
                self.failed[server.name] = server.error or "failed"
                continue
            prefix = valid(server.name)
            if prefix != server.name:
                log.info("mcp: the tools of %r are exposed as %s__<tool>", server.name, prefix)
            for t in server.tools:
                name = exposed_name(server.name, t.name, names)
                names.add(name)
                if name != f"{prefix}__{t.name}":
                    log.info("mcp: tool %r of %r is exposed as %r", t.name, server.name, name)
                self.tools.append(server.make_tool(name, t))
        return self.tools

    @property
    def running(self) -> list[MCPServer]:
        return [s for s in self.servers if s.state != "failed"]

    def banner(self) -> list[str]:
        source = f" in {self.source}" if self.source is not None else ""
        lines = [f"mcp: {len(self.tools)} tools from {len(self.running)} servers{source}"]
        lines += [f"mcp: skipped {name!r}: {why}" for name, why in self.failed.items()]
        return lines

    async def aclose(self) -> None:
        await asyncio.gather(*(s.aclose() for s in self.servers))


class MCPServer:
    """One entry of ``mcpServers``: its live connection, its tools and its state.

    ``state``: ``starting`` → ``running`` | ``failed`` (did not start: skipped for good);
    ``running`` → ``down`` (the connection ended; restarted by the next call) → ``running``;
    anything → ``stopped``.
    """

    def __init__(
        self,
        config: cfg.ServerConfig,
        *,
        start_timeout: float,
        call_timeout: float,
        backoff: tuple[float, float] = (1.0, 60.0),
    ) -> None:
        self.config = config
        self.name = config.name
        self.start_timeout = start_timeout
        self.call_timeout = call_timeout
        self.backoff = backoff
        self.state = "starting"
        self.error: str | None = None
        self.tools: list[Any] = []  # mcp Tool definitions, as listed at start-up
        self.restarts = 0
        self._conn: _Connection | None = None  # the one calls use
        self._conns: set[_Connection] = set()  # every connection whose task still runs
        self._lock = asyncio.Lock()
        self._failures = 0  # restarts since the last call that got an answer
        self._retry_at = 0.0

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        started = time.monotonic()
        conn = await self._connect(list_tools=True)
        if conn is None:
            self.state = "failed"
            log.warning("mcp: server %r skipped: %s", self.name, self.error)
            return
        self.tools = conn.tools
        self.state = "running"
        log.info(
            "mcp: server %r started in %.2f s with %d tools (%s)",
            self.name,
            time.monotonic() - started,
            len(self.tools),
            self.config.describe(),
        )

    async def aclose(self) -> None:
        """Close every connection (in parallel with the other servers' ``aclose``)."""
        self.state, self._conn = "stopped", None
        conns = list(self._conns)
        for conn in conns:
            conn.stop.set()
        if not conns:
            return
        _, pending = await asyncio.wait([c.task for c in conns], timeout=CLOSE_TIMEOUT)
        if pending:
            log.warning("mcp: server %r did not close in %g s; cancelled", self.name, CLOSE_TIMEOUT)
            for conn in conns:
                conn.cancel()
            await asyncio.wait(pending, timeout=CLOSE_TIMEOUT)

    async def _connect(self, *, list_tools: bool) -> _Connection | None:
        """A new connection, or ``None`` with ``self.error`` set."""
        conn = _Connection(self, list_tools=list_tools)
        self._conns.add(conn)
        conn.task.add_done_callback(lambda _: self._conns.discard(conn))
        if self.state == "stopped":
            conn.stop.set()  # closing already: it closes as soon as it is connected
        try:
            # the connection's own deadline cancels the attempt; this only stops waiting for
            # its teardown (closing a server that hangs takes the SDK a few seconds)
            await asyncio.wait_for(conn.ready.wait(), self.start_timeout)
        except TimeoutError:
            conn.error = f"no answer within {self.start_timeout:g} s"
        except BaseException:  # the caller was cancelled (an interrupted turn, shutdown)
            conn.stop.set()
            raise
        if conn.client is not None and not conn.stop.is_set():
            self._conn = conn
            return conn
        self.error = conn.error or "failed to start"
        conn.stop.set()  # a timed-out attempt closes in the background; aclose waits for it
        return None

    def lost(self, conn: _Connection, why: str) -> None:
        """A connection ended or failed: the next call starts a new one."""
        conn.ended = True
        if conn is not self._conn or self.state != "running":
            return
        self.state, self.error = "down", why
        log.warning(
            "mcp: server %r %s; it will be restarted on its next call", self.name, why.rstrip(".")
        )

    # --- calls ----------------------------------------------------------------------------

    def make_tool(self, name: str, t: Any) -> Tool:
        async def call(**args: Any) -> str:
            return await self.call(t.name, args)

        description = t.description or t.title or f"{t.name} (MCP server {self.name})"
        hints = t.annotations
        idempotent = bool(getattr(hints, "idempotent_hint", False))
        # MCP's default for destructiveHint is true, but only where readOnlyHint is false: a
        # tool that says nothing is not taken for destructive (no hint, no claim)
        destructive = bool(getattr(hints, "destructive_hint", False)) and not bool(
            getattr(hints, "read_only_hint", False)
        )
        spec = ToolSpec(name, description, parameters(t.input_schema))
        return Tool(spec, call, PLUGIN, idempotent=idempotent, destructive=destructive)

    async def call(self, tool: str, args: dict[str, Any]) -> str:
        conn, client = await self._live()
        try:
            result = await client.call_tool(
                tool,
                args,
                read_timeout_seconds=self.call_timeout,
                meta=trace_headers() or None,  # SEP-414: the turn's traceparent in _meta
            )
        except MCPError as e:
            if e.code == REQUEST_TIMEOUT:
                raise ToolError(
                    f"MCP server {self.name!r} did not answer {tool} within {self.call_timeout:g} s"
                ) from None
            if e.code == CONNECTION_CLOSED:
                self.lost(conn, "closed the connection during a call")
                raise ToolError(
                    f"MCP server {self.name!r} closed the connection during the call; "
                    "it will be restarted on the next call"
                ) from None
            raise ToolError(f"MCP server {self.name!r}: {e.message}") from None
        except ValidationError as e:
            raise ToolError(f"MCP server {self.name!r} sent an invalid result: {e}") from None
        except Exception as e:  # the transport failed (HTTP errors, broken pipes)
            log.warning("mcp: call %s of server %r failed", tool, self.name, exc_info=True)
            self.lost(conn, f"failed: {describe(e)}")
            raise ToolError(f"MCP server {self.name!r} failed: {describe(e)}") from None
        self._failures, self._retry_at = 0, 0.0
        text: str = result_text(result)
        if result.is_error:
            raise ToolError(text or f"{tool} failed")
        return text

    async def _live(self) -> tuple[_Connection, Client]:
        """The live connection, restarting a server that is down (one restart at a time)."""
        conn = self._conn
        if conn is not None and conn.client is not None and not conn.ended:
            return conn, conn.client
        async with self._lock:
            conn = self._conn
            if conn is not None and conn.client is not None and not conn.ended:
                return conn, conn.client
            if self.state == "stopped":
                raise ToolError(f"MCP server {self.name!r} is shutting down")
            wait = self._retry_at - time.monotonic()
            if wait > 0:
                raise ToolError(
                    f"MCP server {self.name!r} is down ({self.error}); "
                    f"the next restart is in {wait:.1f} s"
                )
            if conn is not None:
                conn.stop.set()  # closes in the background; aclose waits for it
                self._conn = None
            self._failures += 1
            self.restarts += 1
            base, most = self.backoff
            log.info("mcp: restarting server %r (restart %d)", self.name, self.restarts)
            new = await self._connect(list_tools=False)
            # the next restart waits, unless a call gets an answer first (which resets this)
            self._retry_at = time.monotonic() + min(base * 2 ** (self._failures - 1), most)
            if new is None or new.client is None:
                log.warning(
                    "mcp: server %r failed to restart: %s; next try in %.1f s",
                    self.name,
                    self.error,
                    max(0.0, self._retry_at - time.monotonic()),
                )
                raise ToolError(
                    f"MCP server {self.name!r} is down and failed to restart: {self.error}"
                )
            self.state, self.error = "running", None
            log.info("mcp: server %r restarted", self.name)
            return new, new.client


class _Connection:
    """One session with a server, owned by its own task from connect to close."""

    def __init__(self, server: MCPServer, *, list_tools: bool) -> None:
        self.server = server
        self.list_tools = list_tools
        self.client: Client | None = None
        self.tools: list[Any] = []
        self.error: str | None = None
        self.ended = False  # the server hung up (or the session failed)
        self.ready = asyncio.Event()  # set once connected, or once the attempt failed
        self.stop = asyncio.Event()
        self._scope: anyio.CancelScope | None = None
        self.task = asyncio.create_task(self._run(), name=f"mcp server {server.name}")

    def cancel(self) -> None:
        if self._scope is not None:
            self._scope.cancel()

    def _hung_up(self) -> None:
        if not self.stop.is_set() and not self.ended:
            self.server.lost(self, "closed the connection (exited or was killed)")

    async def _run(self) -> None:
        timeout = self.server.start_timeout
        try:
            with anyio.CancelScope(deadline=anyio.current_time() + timeout) as scope:
                self._scope = scope
                transport = _transport(self.server.config, self._hung_up)
                async with Client(transport, client_info=CLIENT_INFO) as client:
                    if self.list_tools:
                        self.tools = await _all_tools(client)
                    scope.deadline = math.inf
                    self.client = client
                    self.ready.set()
                    try:
                        await self.stop.wait()
                    finally:  # cancelled by the transport failing under the session
                        if not self.stop.is_set():
                            self._hung_up()
            if scope.cancelled_caught and self.client is None:
                self.error = f"no answer within {timeout:g} s"
        except Exception as e:
            if self.client is None:
                self.error = describe(e)
            elif not self.stop.is_set():
                log.warning("mcp: session with %r failed: %s", self.server.name, describe(e))
            log.debug("mcp: connection to %r ended with an error", self.server.name, exc_info=True)
        finally:
            self.client = None
            self.ended = True
            self.ready.set()


async def _all_tools(client: Client) -> list[Any]:
    tools: list[Any] = []
    cursor: str | None = None
    for _ in range(100):  # a server whose cursor never ends cannot hang start-up
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


@contextlib.asynccontextmanager
async def _transport(c: cfg.ServerConfig, on_eof: Callable[[], None]) -> AsyncIterator[Any]:
    """The SDK's transport for this entry, its read stream watched for the server hanging up."""
    async with contextlib.AsyncExitStack() as stack:
        if c.type == "stdio":
            # the SDK gives the child HOME, LOGNAME, PATH, SHELL, TERM and USER, plus c.env;
            # its stderr goes to ours; on close: stdin closed, then SIGTERM/SIGKILL to its group
            params = StdioServerParameters(
                command=c.command, args=list(c.args), env=c.env or None, cwd=c.cwd
            )
            read, write = await stack.enter_async_context(stdio_client(params, errlog=sys.stderr))
        elif c.type == "http":
            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers=c.headers, timeout=HTTP_TIMEOUT)
            )
            read, write = await stack.enter_async_context(
                streamable_http_client(c.url, http_client=http)
            )
        else:
            read, write = await stack.enter_async_context(
                sse_client(c.url, headers=c.headers or None)
            )
        yield _Watched(read, on_eof), write


class _Watched:
    """A transport's read stream that calls ``on_eof`` when it ends (the server hung up)."""

    def __init__(self, stream: Any, on_eof: Callable[[], None]) -> None:
        self._stream = stream
        self._on_eof = on_eof

    @property
    def last_context(self) -> Any:
        return getattr(self._stream, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_eof()
            raise

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> _Watched:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def parameters(schema: Any) -> dict[str, Any]:
    """The tool's input schema as a function's parameters: an object, without ``$schema``."""
    out = {k: v for k, v in (schema or {}).items() if k != "$schema"}
    out.setdefault("type", "object")
    if out["type"] == "object":
        out.setdefault("properties", {})
    return out


def describe(e: BaseException) -> str:
    """One line for an error, unwrapping the exception groups anyio raises."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    if isinstance(e, MCPError):
        if e.code == CONNECTION_CLOSED:
            return "the server closed the connection (did the command exit? see its stderr)"
        return f"MCP error {e.code}: {e.message}"
    if isinstance(e, FileNotFoundError):
        return f"command not found: {e.filename or e}"
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
