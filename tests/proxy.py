"""A TCP proxy on loopback in front of a server, for tests of what networks do to clients:
connections cut mid-stream, answers lost, the server out of reach for a while. :class:`Proxy`
runs on the test's event loop; :class:`ThreadedProxy` on its own thread, for tests that block
(pexpect)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class Proxy:
    """A TCP proxy on loopback in front of the server: :meth:`cut` drops every connection;
    ``drop_sends`` drops that many sends' answers (the server got and stored them)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = 0
        self.drop_sends = 0
        self.conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        """Listen (again, on the same port after :meth:`down`); the proxy's base URL."""
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{self.port}"

    async def down(self) -> None:
        """The server out of reach: open connections dropped, new ones refused (:meth:`start`
        brings it back)."""
        server, self.server = self.server, None
        if server is not None:
            server.close()
        self.cut()
        if server is not None:
            await server.wait_closed()

    async def handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        ureader, uwriter = await asyncio.open_connection("127.0.0.1", self.target)
        pair = (cwriter, uwriter)
        self.conns.add(pair)
        doomed = False

        async def up() -> None:
            nonlocal doomed
            while data := await creader.read(65536):
                line = data.split(b"\r\n", 1)[0]
                if self.drop_sends and line.startswith(b"POST ") and b"/messages " in line:
                    self.drop_sends -= 1
                    doomed = True
                uwriter.write(data)
                await uwriter.drain()

        async def down() -> None:
            while data := await ureader.read(65536):
                if doomed:  # the server answered the send: the client never hears it
                    break
                cwriter.write(data)
                await cwriter.drain()

        try:
            await asyncio.wait(
                [asyncio.ensure_future(up()), asyncio.ensure_future(down())],
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            self.conns.discard(pair)
            cwriter.transport.abort()
            uwriter.transport.abort()

    def cut(self) -> int:
        conns = list(self.conns)
        for c, u in conns:
            c.transport.abort()
            u.transport.abort()
        return len(conns)

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()


class ThreadedProxy:
    """A :class:`Proxy` on an event loop of its own thread; its methods block until done."""

    def __init__(self, target: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.proxy = Proxy(target)
        self.url = self.call(self.proxy.start())

    def call(self, work: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(30)

    def cut(self) -> int:
        return int(self.call(self._cut()))

    async def _cut(self) -> int:
        return self.proxy.cut()

    def down(self) -> None:
        self.call(self.proxy.down())

    def up(self) -> None:
        self.call(self.proxy.start())

    def close(self) -> None:
        self.call(self.proxy.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
