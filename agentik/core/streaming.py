"""Responses whose body is written after their handler returned.

aiohttp writes a response in two steps once its handler returns it: ``prepare`` and
``write_eof``. A :class:`LateStream` writes its body in ``write_eof``: the handler, and every
middleware that awaits it, return at once instead of staying in memory, frames and coroutines,
for as long as the body takes; an SSE stream may take hours, and a server holds thousands
(B8 in docs/PERFORMANCE.md). A middleware that holds something for a request's whole life (a
per-client count) asks to be told when the body is done: :meth:`LateStream.when_done`.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web


class LateStream(web.StreamResponse):
    """A response that writes its body in ``write_eof``: subclasses implement :meth:`body`."""

    _done: list[Callable[[], None]] | None = None  # made by the first when_done
    _written = False

    def when_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the body is written, or failed to be."""
        if self._done is None:
            self._done = []
        self._done.append(callback)

    async def body(self) -> None:
        """Write the body (``await self.write(...)``)."""

    async def write_eof(self, data: bytes = b"") -> None:
        if not self._written:
            self._written = True
            try:
                await self.body()
            finally:
                done, self._done = self._done, None
                for callback in done or ():
                    callback()
        await super().write_eof(data)
