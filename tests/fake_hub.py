"""A fake Hugging Face hub on loopback, in a thread of the test process: it answers the file
requests of ``huggingface_hub`` (``HEAD``/``GET /{repo}/resolve/{revision}/{file}``) with the
headers it needs (``X-Repo-Commit``, ``ETag``/``X-Linked-Etag`` = the file's sha256,
``X-Linked-Size``, ``Content-Length``) and ``Range`` requests (206), the way the real hub
answers an LFS file. ``HF_ENDPOINT`` points at it. Every request is recorded in ``requests``;
``fail`` and ``cut_after`` script refusals and connections cut mid-body.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Seen:
    method: str
    path: str
    range: str | None
    authorization: str | None
    sent: int = 0  # body bytes sent


@dataclass
class FakeHub:
    files: dict[str, bytes] = field(default_factory=dict)  # "org/name/file" -> content
    #: (status, X-Error-Code or None) for every request while set
    fail: tuple[int, str | None] | None = None
    #: cut the next GET's body after this many bytes; then answer GETs with ``fail_after_cut``
    cut_after: int | None = None
    fail_after_cut: int | None = None
    #: serve these bytes instead of the file's (the headers still describe the real file)
    body_override: bytes | None = None
    requests: list[Seen] = field(default_factory=list)
    url: str = ""

    def start(self) -> FakeHub:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def main() -> None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self.handle)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            port = self._runner.addresses[0][1]
            self.url = f"http://127.0.0.1:{port}"
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(main())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def gets(self) -> list[Seen]:
        return [r for r in self.requests if r.method == "GET"]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        seen = Seen(
            request.method,
            request.path,
            request.headers.get("Range"),
            request.headers.get("Authorization"),
        )
        self.requests.append(seen)
        if self.fail is not None:
            status, code = self.fail
            headers = {"X-Error-Code": code, "X-Error-Message": "fake refusal"} if code else {}
            return web.json_response({"error": "fake refusal"}, status=status, headers=headers)
        match = re.fullmatch(r"/(?:models/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)", request.path)
        content = self.files.get(f"{match[1]}/{match[3]}") if match else None
        if content is None:
            code = (
                "EntryNotFound"
                if match and any(k.startswith(match[1] + "/") for k in self.files)
                else "RepoNotFound"
            )
            return web.json_response(
                {"error": code}, status=404, headers={"X-Error-Code": code, "X-Repo-Commit": COMMIT}
            )
        etag = hashlib.sha256(content).hexdigest()
        headers = {
            "X-Repo-Commit": COMMIT,
            "ETag": f'"{etag}"',
            "X-Linked-Etag": f'"{etag}"',
            "X-Linked-Size": str(len(content)),
            "Accept-Ranges": "bytes",
        }
        if request.method == "HEAD":
            return web.Response(
                status=200, headers={**headers, "Content-Length": str(len(content))}
            )
        if self.cut_after is None and self.fail_after_cut is not None:
            return web.json_response({"error": "later"}, status=self.fail_after_cut)
        body = self.body_override if self.body_override is not None else content
        start, status = 0, 200
        if seen.range:
            start = int(re.fullmatch(r"bytes=(\d+)-", seen.range)[1])  # type: ignore[index]
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
        part = body[start:]
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = len(part)
        await response.prepare(request)
        if self.cut_after is not None:
            cut, self.cut_after = self.cut_after, None
            await response.write(part[:cut])
            seen.sent = cut
            assert request.transport is not None
            request.transport.close()  # the connection drops mid-body
            return response
        await response.write(part)
        seen.sent = len(part)
        await response.write_eof()
        return response


def hub_env(hub: Any, models_dir: Any, **extra: str) -> dict[str, str]:
    """The environment of an ``agentik`` process that fetches from ``hub`` into ``models_dir``."""
    return {
        "HF_ENDPOINT": hub.url,
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HOME": str(models_dir / "hf_home"),  # no token or cache of the user's
        "AGENTIK_MODELS_DIR": str(models_dir),
        **extra,
    }
