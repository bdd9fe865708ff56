"""A minimal client for an OpenAI-compatible endpoint (``/chat/completions``, ``/embeddings``),
on aiohttp; the ``http`` embedding backend (``plugins/embedding_http``) uses it too.

It POSTs a request body serialised once with ``json.dumps``, retries like the ``openai`` SDK
(connection errors, timeouts, 408, 409, 429 and 5xx; exponential back-off or ``Retry-After``)
but only before the reply's body is read, splits a streamed body into SSE ``data:`` payloads,
and maps every failure to an :class:`LLMError` whose message is one sentence for the user (what
happened, and the server's own message where it gave one); the details go to the log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from agentik.core.llm import CONTEXT_LENGTH, LLMError
from agentik.core.observe import trace_headers

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 409, 429})  # and every 5xx
BACKOFF_START, BACKOFF_MAX, RETRY_AFTER_MAX = 0.5, 8.0, 60.0
STREAM_CUT = "the model server closed the stream in the middle of the reply"
SERVER_MESSAGE_MAX = 2000  # characters of the server's error message given to the user
#: how servers say the context is full: OpenAI, vLLM and llama-cpp-python ("maximum context
#: length", code context_length_exceeded), llama.cpp ("exceeds the available context size"),
#: LiteLLM (ContextWindowExceededError), others ("context window", "context length")
CONTEXT_FULL = re.compile(
    r"context_?length_?exceeded|contextwindowexceeded|exceed_context_size"
    r"|maximum context length|context (?:window|size|length)",
    re.IGNORECASE,
)


def context_length_error(
    message: str, context_window: int | None, body: str = ""
) -> LLMError | None:
    """The :data:`CONTEXT_LENGTH` error (saying what to set) when the server's message, or the
    error body it came in (its ``code``), says the context is full; else None."""
    if not CONTEXT_FULL.search(body or message):
        return None
    if len(message) > SERVER_MESSAGE_MAX:
        message = message[:SERVER_MESSAGE_MAX] + "…"
    if context_window is None:
        advice = "set OPENAI_CONTEXT_WINDOW to the server's context size to turn on compaction"
    else:
        advice = f"lower OPENAI_CONTEXT_WINDOW (now {context_window}) so compaction starts earlier"
    return LLMError(
        f"the conversation no longer fits the model's context ({message}); {advice}, "
        "or start a new conversation",
        CONTEXT_LENGTH,
    )


def retry_delay(retry: int, retry_after: str | None) -> float:
    """Seconds before retry number ``retry`` (0-based): the server's ``Retry-After`` (in seconds,
    at most 60), else 0.5 s x 2^retry, at most 8 s, minus up to 25 % jitter (as the SDK does)."""
    if retry_after:
        try:
            seconds = float(retry_after)
        except ValueError:
            pass  # an HTTP date: use the back-off
        else:
            if seconds >= 0:  # not NaN, not negative
                return min(seconds, RETRY_AFTER_MAX)
    return min(BACKOFF_START * 2.0**retry, BACKOFF_MAX) * (1 - 0.25 * random.random())


def retryable(status: int) -> bool:
    return status in RETRY_STATUSES or status >= 500


class OpenAIClient:
    """One ``aiohttp.ClientSession`` (a pool of keep-alive connections) for one endpoint:
    ``path`` under ``base_url`` (``/chat/completions``, ``/embeddings``); ``what`` names the
    server in error messages (``the model server failed (HTTP 500)``)."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float,
        max_retries: int,
        context_window: int | None = None,
        path: str = "/chat/completions",
        what: str = "model server",
    ) -> None:
        self.base_url, self.api_key = base_url, api_key
        self.context_window = context_window  # named in the advice of a context-length error
        self.url = f"{base_url}{path}"
        self.what = what
        self.timeout, self.max_retries = timeout, max_retries
        self._session: aiohttp.ClientSession | None = None
        self._proxy: URL | None = None
        self._proxy_auth: aiohttp.BasicAuth | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:  # start() normally made it; be lenient in scripts and tests
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),  # no pool limit: one per live stream
                headers={
                    "Authorization": f"Bearer {self.api_key}",
                    "Content-Type": "application/json",
                },
                # connecting, and every gap between reads (the first byte included)
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=self.timeout, sock_read=self.timeout
                ),
            )
            # HTTP(S)_PROXY and NO_PROXY, as the SDK (httpx) honoured them; read once, as
            # trust_env=True would per request (2 thread hops, ~0.7 ms) and it would also add
            # a ~/.netrc login to our Authorization header
            try:
                self._proxy, self._proxy_auth = get_env_proxy_for_url(URL(self.url))
            except LookupError:
                self._proxy, self._proxy_auth = None, None
        return self._session

    async def start(self) -> None:
        _ = self.session

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # --- requests -------------------------------------------------------------------------

    @asynccontextmanager
    async def post(
        self, body: dict[str, Any] | bytes, *, retry_timeouts: bool = True
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST ``body`` and hold the 2xx response open (closing it on exit, also on
        cancellation); retries and maps every failure before that to an :class:`LLMError`.
        ``retry_timeouts=False``: a request that timed out is not sent again (a server still
        busy with it would only queue the copy behind it). ``body``: a dict, or its JSON."""
        data = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
        session = self.session  # made (and the proxy read) on first use
        retry = 0
        while True:
            cause: BaseException | None
            retry_after = None
            try:
                resp = await session.post(
                    self.url,
                    data=data,
                    headers=trace_headers() or None,  # traceparent, when tracing is on
                    allow_redirects=False,
                    proxy=self._proxy,
                    proxy_auth=self._proxy_auth,
                )
            except TimeoutError as e:  # aiohttp's timeouts subclass it
                error, cause, again = self.timed_out(), e, retry_timeouts
            except aiohttp.ClientError as e:
                message = f"could not connect to the {self.what} at {self.base_url}"
                error, cause, again = LLMError(message, "connection"), e, True
            else:
                if resp.status < 300:
                    break
                async with resp:
                    error = await self._status_error(resp)
                cause, again = None, retryable(resp.status)
                retry_after = resp.headers.get("Retry-After")
            if not again or retry >= self.max_retries:
                if cause is not None:
                    log.warning("%s: %s: %s", error, type(cause).__name__, cause)
                raise error from cause
            delay = retry_delay(retry, retry_after)
            log.info(
                "%s (%s); retry %d of %d in %.2f s",
                error,
                cause,
                retry + 1,
                self.max_retries,
                delay,
            )
            await asyncio.sleep(delay)
            retry += 1
        try:
            async with resp:
                yield resp
        except TimeoutError as e:
            raise self.timed_out() from e
        except aiohttp.ClientError as e:
            log.warning("the reply from %s broke off: %s: %s", self.base_url, type(e).__name__, e)
            raise LLMError(STREAM_CUT, "connection") from e

    async def stream(self, body: dict[str, Any] | bytes) -> AsyncIterator[bytes]:
        """POST ``body`` and yield the payload of each SSE ``data:`` line (``b"[DONE]"``
        included). Close the generator (``contextlib.aclosing``) to close the response."""
        async with self.post(body) as resp:
            async for line in lines(resp.content):
                if line.startswith(b"data:"):  # not blank separators, comments, event names
                    yield line[5:].strip()

    async def complete(self, body: dict[str, Any] | bytes, *, retry_timeouts: bool = True) -> Any:
        """POST ``body`` (not streamed) and return its decoded JSON."""
        async with self.post(body, retry_timeouts=retry_timeouts) as resp:
            raw = await resp.read()
        try:
            return json.loads(raw)
        except ValueError as e:
            raise LLMError(f"{self.base_url} sent a malformed reply: {e}", "bad_response") from e

    # --- errors ---------------------------------------------------------------------------

    def timed_out(self) -> LLMError:
        what = "model" if self.what == "model server" else self.what
        return LLMError(
            f"the {what} at {self.base_url} timed out after {self.timeout:g} s", "timeout"
        )

    async def _status_error(self, resp: aiohttp.ClientResponse) -> LLMError:
        """``the model server rejected the request (HTTP 400): <its message>``; a body without
        a message (an HTML error page) goes to the log only."""
        try:
            raw = await resp.read()
        except (TimeoutError, aiohttp.ClientError):
            raw = b""
        text = raw.decode(errors="replace").strip()
        message = server_message(text)
        log.warning("the %s %s answered HTTP %d: %s", self.what, self.url, resp.status, text[:4000])
        # only a chat's context can fill up (an embedding input too long is the caller's)
        context_error = (
            context_length_error(message, self.context_window, text)
            if self.url.endswith("/chat/completions")
            else None
        )
        if context_error is not None:
            return context_error
        what = "rejected the request" if resp.status < 500 else "failed"
        status = f"HTTP {resp.status}"
        if message:
            if len(message) > SERVER_MESSAGE_MAX:
                message = message[:SERVER_MESSAGE_MAX] + "…"
            summary = f"the {self.what} {what} ({status}): {message}"
        else:
            summary = f"the {self.what} {what} ({status} {resp.reason or ''}".rstrip() + ")"
        if resp.headers.get("Location"):
            summary += f" (redirected to {resp.headers['Location']})"
        return LLMError(summary, f"http_{resp.status}")


def server_message(body: str) -> str:
    """The message in an error body: OpenAI's ``{"error": {"message"}}``, a plain ``{"error":
    "…"}``, FastAPI's ``{"detail": …}``; "" when there is none. Whitespace is collapsed."""
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(data, dict):
        return ""
    error = data.get("error", data.get("detail"))
    if isinstance(error, dict):
        error = error.get("message") or error.get("msg")
    elif isinstance(error, list):  # FastAPI's validation errors
        error = "; ".join(
            f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}"
            if isinstance(e, dict)
            else str(e)
            for e in error
        )
    return " ".join(str(error).split()) if error else ""


async def lines(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The lines of a body, without their ``\\n``, as they arrive. Unlike
    ``async for line in content`` there is no line-length limit (a whole reply may come as one
    chunk) and one split per network read rather than one ``readline`` per line."""
    head: list[bytes] = []  # the start of a line still without its end
    async for data in content.iter_any():
        *complete, tail = data.split(b"\n")
        if complete:
            if head:
                complete[0] = b"".join((*head, complete[0]))
                head.clear()
            for line in complete:
                yield line
        if tail:
            head.append(tail)
    if head:
        yield b"".join(head)
