"""The floors' LLM call: POST the chat request with aiohttp, read the SSE lines, ``json.loads``
each chunk and yield the content deltas (the minimal correct way to read the stream)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp

SYSTEM = "You are a helpful assistant."


def make_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))


async def stream_deltas(
    session: aiohttp.ClientSession,
    base_url: str,
    text: str,
    history: list[dict[str, str]] | None = None,
) -> AsyncIterator[str]:
    """``history``: the chat's earlier user/assistant messages (sent before the new one)."""
    messages = [
        {"role": "system", "content": SYSTEM},
        *(history or ()),
        {"role": "user", "content": text},
    ]
    body = {
        "model": "fake-model",
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": "Bearer sk-bench"}
    async with session.post(f"{base_url}/chat/completions", json=body, headers=headers) as r:
        r.raise_for_status()
        async for line in r.content:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            for choice in chunk.get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    yield content
