"""The floors' LLM call: POST the chat request with aiohttp, read the SSE lines, ``json.loads``
each chunk and yield the content deltas (the minimal correct way to read the stream).

Lines are split once per network read (``iter_any`` + ``bytes.split``), not one ``readline`` per
line (``async for line in r.content``): with many chunks per read that is the cheaper of the two,
and it is what agentik's openai client does (plugins/llm_openai/client.py ``lines``), so the
floor is not beaten by a trick it could use too."""

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
        tail = b""
        async for data in r.content.iter_any():
            *lines, rest = (tail + data).split(b"\n") if tail else data.split(b"\n")
            tail = rest
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                chunk = json.loads(payload)
                for choice in chunk.get("choices") or ():
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        yield content
