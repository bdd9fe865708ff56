"""The fake OpenAI-compatible server of ``tests/fake_openai.py``, with a default reply that the
*user text* selects, so a benchmark needs no scripting round trip and agentik and the floors
get byte-identical streams from the same process.

A user text ``bench n=100 chars=300 delay=0.02`` gets a reply of ``chars`` characters (default
``3 * n``) in ``n`` content chunks, ``delay`` seconds before each chunk (0.02 = 50 tok/s).
``bench call=NAME`` gets one call of the tool ``NAME`` (then, after its result, the echo).
Any other text gets the fake's normal echo. Run: ``python bench/fake_llm.py --port-file F``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tests.fake_openai as fake_module  # noqa: E402
from tests.fake_openai import FakeOpenAI, Reply, _serve, echo, message_text  # noqa: E402

WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
SPEC = re.compile(r"bench n=(\d+)(?: chars=(\d+))?(?: delay=([0-9.]+))?")
#: ``bench call=NAME``: the reply to the user's message is one call of the tool NAME
CALL = re.compile(r"bench call=([a-zA-Z0-9_-]+)")


def spec_text(n: int, chars: int | None = None, delay: float = 0.0) -> str:
    """The user text that asks this fake for an ``n``-chunk reply."""
    out = f"bench n={n}"
    if chars is not None:
        out += f" chars={chars}"
    if delay:
        out += f" delay={delay:g}"
    return out


def reply_text(n: int, chars: int | None = None) -> str:
    size = max(n, chars if chars is not None else 3 * n)
    return (WORDS * (size // len(WORDS) + 1))[:size]


def bench_default(body: dict[str, Any]) -> Reply:
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    text = message_text(users[-1]) if users else ""
    call = CALL.search(text)
    if call is not None and body.get("messages", [{}])[-1].get("role") == "user":
        return Reply(tool_calls=[(call.group(1), {"path": "notes.txt", "text": "hello"})])
    m = SPEC.search(text)
    if m is None:
        return echo(body)
    n = int(m.group(1))
    chars = int(m.group(2)) if m.group(2) else None
    delay = float(m.group(3)) if m.group(3) else 0.0
    return Reply(reply_text(n, chars), chunks=n, delay=delay, usage=(10, n))


class BenchFake(FakeOpenAI):
    def __init__(self) -> None:
        super().__init__(default=bench_default)
        self.requests = _Discard()  # a benchmark sends 100k requests: keep none


class _Discard(list):  # type: ignore[type-arg]
    def append(self, _item: Any) -> None:
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="The fake OpenAI server, benchmark defaults.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path)
    args = parser.parse_args()
    fake_module.FakeOpenAI = BenchFake  # type: ignore[misc]  # _serve builds FakeOpenAI()
    asyncio.run(_serve(args.host, args.port, args.port_file))
