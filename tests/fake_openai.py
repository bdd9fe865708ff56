"""A fake OpenAI-compatible chat-completions server (aiohttp, loopback) for tests and benchmarks.

In-process::

    fake = FakeOpenAI()
    await fake.start()                      # fake.base_url == "http://127.0.0.1:PORT/v1"
    fake.script(Reply("Hello there"), Reply(tool_calls=[("add", {"a": 1})]))
    fake.script(Reply('{"skills": []}', match="skill library"))  # only for such a request
    ...                                     # fake.requests holds every request body
    await fake.close()

As a process (end-to-end tests): ``python tests/fake_openai.py --port 0 --port-file PATH``
writes the bound port to PATH and serves until SIGTERM; ``POST /_fake/script`` (a JSON list of
Reply fields), ``GET /_fake/requests`` and ``POST /_fake/reset`` control it from outside.
With an empty script it answers ``echo: <last user message text>``. A reply with ``match``
answers only a request whose messages contain that text (a background one-shot call next to the
turns); the others answer the requests in order.

``POST /v1/embeddings`` answers deterministic vectors (:func:`embed_text`: a hashed bag of word
stems, so texts that share words are close) of the request's ``dimensions`` (default 1536);
``fake.embedding_faults`` (``POST /_fake/embeddings {"faults": [...], "mode": ...}``) makes the
next requests fail (a status, or ``"short"``: vectors one number too short), ``mode`` every one.

``FakeOpenAI(quirks=Quirks(...))`` (or ``--quirks llama-cpp-python``) makes it behave like a real
server that departs from OpenAI's API in the ways listed in :class:`Quirks`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import math
import re
import signal
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aiohttp import web

AUTO: Any = "auto"
MODEL = "fake-model"
SERVER_ERROR = "The server had an error while processing your request."
CONTENT_TYPES = {True: "text/event-stream", False: "application/json"}
ERRORS = {  # status -> (default message, type, code), shaped like OpenAI's error bodies
    400: ("Invalid request.", "invalid_request_error", None),
    401: ("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
    404: ("The model does not exist.", "invalid_request_error", "model_not_found"),
    429: ("Rate limit reached for requests.", "requests", "rate_limit_exceeded"),
}


@dataclass(frozen=True)
class Quirks:
    """How real servers depart from OpenAI's API (all off: as polite as OpenAI).
    :data:`LLAMA_CPP_PYTHON` is what llama-cpp-python 0.3 was seen doing (docs/llm_servers.md)."""

    repeat_tool_names: bool = False  # every tool-call fragment repeats its id and function.name
    string_content_only: bool = False  # HTTP 500 when a message has "content": null
    no_usage: bool = False  # ignores stream_options.include_usage: never sends usage
    tools_need_tool_choice: bool = False  # without tool_choice the model sees no tools
    no_streamed_tools: bool = False  # stream + tools + automatic choice: a 200, an empty stream


# with its default chat format; with --chat_format chatml-function-calling add no_streamed_tools
LLAMA_CPP_PYTHON = Quirks(
    repeat_tool_names=True, string_content_only=True, no_usage=True, tools_need_tool_choice=True
)
QUIRKS = {"none": Quirks(), "llama-cpp-python": LLAMA_CPP_PYTHON}
INVENTED = "It is sunny and 22 degrees."  # what a model says when it was not given the tools


@dataclass
class Reply:
    """One scripted answer. With ``status`` other than 200, ``text`` is the error message."""

    text: str = ""
    chunks: int | None = None  # split text into this many chunks (default: one per word)
    tool_calls: list[tuple[str, dict[str, Any] | str]] = field(default_factory=list)
    reasoning: str = ""  # streamed as delta.reasoning_content before the text
    usage: tuple[int, int] | None = AUTO  # (prompt, completion); AUTO: ~chars/4; None: omit
    status: int = 200
    delay: float = 0.0  # seconds before each chunk
    hang: bool = False  # send the headers, then nothing until the server closes
    fail_after: int | None = None  # drop the connection after this many chunks
    raw: str | None = None  # streamed verbatim instead of chunks (malformed streams)
    finish: str | None = None  # the finish_reason (default: "tool_calls" or "stop")
    code: str | None = None  # the error body's code, e.g. "context_length_exceeded" (a 400)
    match: str | None = None  # only for a request whose messages contain this text

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Reply:
        raw = dict(raw)
        raw["tool_calls"] = [tuple(c) for c in raw.get("tool_calls", [])]
        if isinstance(raw.get("usage"), list):
            raw["usage"] = tuple(raw["usage"])
        return cls(**raw)


def split(text: str, n: int | None) -> list[str]:
    if not text:
        return []
    if n is None:
        return re.findall(r"\s*\S+|\s+$", text)
    n = max(1, min(n, len(text)))
    cuts = [len(text) * i // n for i in range(n + 1)]
    return [text[a:b] for a, b in itertools.pairwise(cuts)]


def message_text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def last_user_text(body: dict[str, Any]) -> str:
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    return message_text(users[-1]) if users else ""


def echo(body: dict[str, Any]) -> Reply:
    return Reply(f"echo: {last_user_text(body)}")


def deltas(
    reply: Reply, calls: list[tuple[str, str, str]], quirks: Quirks = Quirks()
) -> list[dict[str, Any]]:
    """The streamed deltas: role, reasoning, text, then each tool call in 3+ fragments (each
    repeating its id and name with ``quirks.repeat_tool_names``, as llama-cpp-python does)."""
    out: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    out += [{"reasoning_content": p} for p in split(reply.reasoning, reply.chunks)]
    out += [{"content": p} for p in split(reply.text, reply.chunks)]
    for i, (call_id, name, args) in enumerate(calls):
        head = {"index": i, "id": call_id, "type": "function"}
        out.append({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]})
        half = len(args) // 2
        for part in (args[:half], args[half:]):
            fragment: dict[str, Any] = {"index": i, "function": {"arguments": part}}
            if quirks.repeat_tool_names:
                fragment = {**head, "function": {"name": name, "arguments": part}}
            out.append({"tool_calls": [fragment]})
    return out


EMBEDDING_DIMENSION = 1536
WORD = re.compile(r"\w+")
# words that say nothing about a text's topic (a real model weighs them down too)
FILLER = frozenset(
    [
        "the",
        "and",
        "are",
        "what",
        "which",
        "how",
        "you",
        "your",
        "about",
        "for",
        "with",
        "this",
        "that",
        "was",
        "were",
        "has",
        "have",
        "does",
        "did",
        "can",
        "not",
        "too",
        "any",
        "its",
    ]
)


def embed_text(text: str, dimension: int = EMBEDDING_DIMENSION) -> list[float]:
    """A unit vector: the first five letters of each word (of three letters or more, not
    :data:`FILLER`) hashed to a position and a sign, a bag of stems: texts sharing words are
    close, unrelated ones nearly orthogonal."""
    vector = [0.0] * dimension
    for word in WORD.findall(text.casefold()):
        if len(word) < 3 or word in FILLER:
            continue
        digest = hashlib.blake2b(word[:5].encode(), digest_size=8).digest()
        index = int.from_bytes(digest[:4], "little") % dimension
        vector[index] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]


def usage_of(body: dict[str, Any], reply: Reply, calls: list[tuple[str, str, str]]) -> Any:
    usage = reply.usage
    if usage is AUTO:
        out = len(reply.text) + len(reply.reasoning) + sum(len(c[2]) for c in calls)
        usage = (max(1, len(json.dumps(body.get("messages", []))) // 4), max(1, out // 4))
    if usage is None:
        return None
    return {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}


class FakeOpenAI:
    def __init__(
        self,
        *,
        default: Callable[[dict[str, Any]], Reply] | None = None,
        quirks: Quirks = Quirks(),
    ) -> None:
        self.default = default or echo
        self.quirks = quirks
        self.requests: list[dict[str, Any]] = []
        #: the headers of each request of ``requests`` (a traceparent, the Authorization)
        self.request_headers: list[dict[str, str]] = []
        self.embedding_requests: list[dict[str, Any]] = []
        #: failures of the next /embeddings requests, one each (a status, or "short")
        self.embedding_faults: deque[int | str] = deque()
        #: the failure of every /embeddings request after those (None: answer)
        self.embedding_mode: int | str | None = None
        self._script: deque[Reply] = deque()
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.host, self.port = "127.0.0.1", 0
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self._completions)
        self.app.router.add_get("/v1/models", self._models)
        self.app.router.add_post("/v1/embeddings", self._embeddings)
        self.app.router.add_post("/_fake/embeddings", self._control_embeddings)
        self.app.router.add_post("/_fake/script", self._control_script)
        self.app.router.add_get("/_fake/requests", self._control_requests)
        self.app.router.add_post("/_fake/reset", self._control_reset)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        self.host, self.port = host, sock.getsockname()[1]
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    async def close(self) -> None:
        self._closing.set()  # releases hanging replies
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def script(self, *replies: Reply) -> None:
        self._script.extend(replies)

    def _next(self, body: dict[str, Any]) -> Reply:
        """The first scripted reply whose ``match`` is in the request's messages, else the first
        without ``match`` (background calls and turns interleave), else the default."""
        text = "\n".join(message_text(m) for m in body.get("messages", []))
        matching = [r for r in self._script if r.match is not None and r.match in text]
        plain = [r for r in self._script if r.match is None]
        for reply in matching or plain:
            self._script.remove(reply)
            return reply
        return self.default(body)

    # --- the OpenAI API -------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": MODEL, "object": "model", "created": 0, "owned_by": "fake"}
        return web.json_response({"object": "list", "data": [model]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.request_headers.append(dict(request.headers))
        reply = self._next(body)
        stream = bool(body.get("stream"))
        reply = self._quirky(body, reply, stream)
        if reply.status != 200:
            text, kind, code = ERRORS.get(reply.status, (SERVER_ERROR, "server_error", None))
            error = {"message": reply.text or text, "type": kind, "param": None,
                     "code": reply.code or code}  # fmt: skip
            return web.json_response({"error": error}, status=reply.status)
        if reply.hang:  # the headers, then nothing until close()
            resp = web.StreamResponse(headers={"Content-Type": CONTENT_TYPES[stream]})
            await resp.prepare(request)
            await self._closing.wait()
            return resp
        base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
                "model": body.get("model", MODEL)}  # fmt: skip
        calls = [(f"call_{uuid.uuid4().hex[:24]}", name, a if isinstance(a, str) else json.dumps(a))
                 for name, a in reply.tool_calls]  # fmt: skip
        usage = None if self.quirks.no_usage else usage_of(body, reply, calls)
        finish = reply.finish or ("tool_calls" if calls else "stop")
        if not stream:
            await asyncio.sleep(reply.delay)
            message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
            if reply.reasoning:
                message["reasoning_content"] = reply.reasoning
            if calls:
                message["tool_calls"] = [{"id": i, "type": "function", "function": {
                    "name": n, "arguments": a}} for i, n, a in calls]  # fmt: skip
            choice = {"index": 0, "message": message, "finish_reason": finish}
            whole = {**base, "object": "chat.completion", "choices": [choice]}
            return web.json_response({**whole, "usage": usage} if usage else whole)

        resp = web.StreamResponse(headers={"Content-Type": CONTENT_TYPES[True]})
        await resp.prepare(request)
        if reply.raw is not None:
            await resp.write(reply.raw.encode())
            await resp.write_eof()
            return resp
        chunk = {**base, "object": "chat.completion.chunk"}
        frames = [{**chunk, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}
                  for d in deltas(reply, calls, self.quirks)]  # fmt: skip
        frames.append({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if usage and (body.get("stream_options") or {}).get("include_usage"):
            frames.append({**chunk, "choices": [], "usage": usage})
        try:
            for n, frame in enumerate(frames):
                if reply.fail_after is not None and n >= reply.fail_after:
                    assert request.transport is not None
                    request.transport.close()  # a broken stream: no terminating chunk
                    return resp
                if reply.delay:
                    await asyncio.sleep(reply.delay)
                await resp.write(b"data: " + json.dumps(frame).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionError:
            pass  # the client went away
        return resp

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.embedding_requests.append(body)
        fault = self.embedding_faults.popleft() if self.embedding_faults else self.embedding_mode
        if isinstance(fault, int):
            text, kind, code = ERRORS.get(fault, (SERVER_ERROR, "server_error", None))
            error = {"message": text, "type": kind, "param": None, "code": code}
            return web.json_response({"error": error}, status=fault)
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        dimension = int(body.get("dimensions") or EMBEDDING_DIMENSION)
        length = dimension - 1 if fault == "short" else dimension
        data = [{"object": "embedding", "index": i, "embedding": embed_text(t, dimension)[:length]}
                for i, t in enumerate(texts)]  # fmt: skip
        tokens = sum(len(WORD.findall(t)) for t in texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        model = body.get("model", "text-embedding-3-small")
        return web.json_response({"object": "list", "data": data, "model": model, "usage": usage})

    def _quirky(self, body: dict[str, Any], reply: Reply, stream: bool) -> Reply:
        """``reply`` as a server with :attr:`quirks` would answer ``body``."""
        quirks = self.quirks
        if quirks.string_content_only and any(
            m.get("content") is None for m in body.get("messages", [])
        ):  # pydantic's error, as llama-cpp-python answers it
            return Reply("1 validation error: messages.content: Input should be a valid string",
                         status=500)  # fmt: skip
        tools = bool(body.get("tools"))
        automatic = body.get("tool_choice") in (None, "auto")
        if tools and stream and automatic and quirks.no_streamed_tools:
            # its "Automatic streaming tool choice is not supported", raised after the 200
            return replace(reply, raw="")
        if tools and quirks.tools_need_tool_choice and "tool_choice" not in body:
            return replace(reply, text=reply.text or INVENTED, tool_calls=[])
        return reply

    # --- control endpoints (for tests that run the fake as another process) ---------------

    async def _control_script(self, request: web.Request) -> web.Response:
        self.script(*(Reply.from_json(r) for r in await request.json()))
        return web.json_response({"queued": len(self._script)})

    async def _control_embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.embedding_faults.extend(body.get("faults", []))
        self.embedding_mode = body.get("mode")
        return web.json_response({"ok": True})

    async def _control_requests(self, request: web.Request) -> web.Response:
        return web.json_response(self.requests)

    async def _control_reset(self, request: web.Request) -> web.Response:
        self._script.clear()
        self.requests.clear()
        self.request_headers.clear()
        self.embedding_requests.clear()
        self.embedding_faults.clear()
        self.embedding_mode = None
        return web.json_response({"ok": True})


async def _serve(
    host: str, port: int, port_file: Path | None, quirks: Quirks | None = None
) -> None:
    # bench/fake_llm.py swaps FakeOpenAI for a subclass that takes no quirks
    fake = FakeOpenAI() if quirks is None else FakeOpenAI(quirks=quirks)
    await fake.start(host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if port_file is not None:  # written atomically: a reader never sees an empty file
        tmp = port_file.with_name(port_file.name + ".tmp")
        tmp.write_text(str(fake.port))
        tmp.replace(port_file)
    print(f"fake OpenAI on {fake.base_url}", flush=True)
    try:
        await stop.wait()
    finally:
        await fake.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="A fake OpenAI-compatible server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path)
    parser.add_argument("--quirks", choices=sorted(QUIRKS), default="none")
    args = parser.parse_args()
    asyncio.run(_serve(args.host, args.port, args.port_file, QUIRKS[args.quirks]))
