"""The ``openai`` backend: any OpenAI-compatible chat-completions endpoint, over aiohttp.

It does not use the ``openai`` SDK. Benchmarks (docs/PERFORMANCE.md, B1/B4/B5/B7) measured the SDK
as the server's bottleneck: (1) it re-validates and transforms the whole request, history
included, on every call (677 µs for 2 messages, 3.7 ms for 20, 18 ms for 100: 85 % of the turn
time of a 65-turn chat); (2) reading the stream through its httpx2/h11/anyio stack took 74 % of
the server's CPU with 60 concurrent streams; (3) ``import openai`` cost 350-500 ms of start-up
and ~30 MB of memory. Here the request is a plain dict serialised once with ``json.dumps``, the
SSE stream is read with aiohttp's C parser and each chunk parsed with ``json.loads``
(``client.py`` holds the HTTP part: session, retries, error mapping).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

from agentik.core.llm import (
    SUMMARY_PREFIX,
    HistoryItem,
    LLMBackend,
    LLMChunk,
    LLMConversation,
    LLMError,
    LLMInput,
    ReasoningDelta,
    TextDelta,
    ToolCallRequest,
    ToolResultInput,
    Usage,
    UserInput,
)
from agentik.core.tools import ToolSpec
from agentik_llm_openai.client import OpenAIClient

log = logging.getLogger(__name__)

Message = dict[str, Any]
NO_RESULT = "Error: no result was recorded for this tool call."


class OpenAIBackend(LLMBackend):
    capabilities = None

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        timeout: float = 60.0,
        max_retries: int = 2,
        context_window: int | None = None,
    ) -> None:
        self.base_url, self.api_key, self.model = base_url, api_key, model
        self.timeout, self.max_retries = timeout, max_retries
        self.context_window = context_window
        self.description = f"openai {model} @ {base_url}"
        self.client = OpenAIClient(base_url, api_key, timeout=timeout, max_retries=max_retries)

    async def start(self) -> None:
        await self.client.start()

    async def aclose(self) -> None:
        await self.client.aclose()

    def create_conversation(
        self, system_prompt: str, history: Sequence[HistoryItem], tools: Sequence[ToolSpec]
    ) -> OpenAIConversation:
        return OpenAIConversation(self, history_messages(system_prompt, history), tools)

    async def complete(self, prompt: str, *, system_prompt: str | None = None) -> str:
        messages: list[Message] = [{"role": "user", "content": prompt}]
        if system_prompt:
            messages.insert(0, {"role": "system", "content": system_prompt})
        response = await self.client.complete({"model": self.model, "messages": messages})
        try:
            choices = response["choices"]
            if not choices:
                raise LLMError(f"{self.base_url} answered with no choices", "bad_response")
            return choices[0]["message"]["content"] or ""
        except LLMError:
            raise
        except Exception as e:
            raise self.error(e) from e

    def error(self, e: Exception) -> LLMError:
        """Map an error in reading a reply (the client maps HTTP ones) to an :class:`LLMError`."""
        if isinstance(e, ValueError | TypeError | AttributeError | KeyError | IndexError):
            # json.JSONDecodeError, or a chunk of the wrong shape
            return LLMError(
                f"{self.base_url} sent a malformed reply: {type(e).__name__}: {e}", "bad_response"
            )
        log.warning("unexpected error from the model endpoint", exc_info=e)
        return LLMError(f"the model call failed: {type(e).__name__}: {e}", "llm_error")


class OpenAIConversation(LLMConversation):
    """Holds the OpenAI ``messages`` of one chat; a reply is appended only once it completed."""

    def __init__(
        self, backend: OpenAIBackend, messages: list[Message], tools: Sequence[ToolSpec]
    ) -> None:
        self.backend = backend
        self.messages = messages
        self.tools = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                },
            }
            for t in tools
        ]

    async def stream(self, inputs: Sequence[LLMInput]) -> AsyncIterator[LLMChunk]:
        new = [input_message(i) for i in inputs]
        request: dict[str, Any] = {
            "model": self.backend.model,
            "messages": self.messages + new,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.tools:
            request["tools"] = self.tools
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        usage: Usage | None = None
        finished = False
        held = ""  # a high surrogate whose pair comes in the next chunk
        try:
            async with aclosing(self.backend.client.stream(request)) as lines:
                async for data in lines:
                    if data == b"[DONE]":
                        finished = True
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise LLMError(
                            f"the model stream failed: {_error_text(chunk)}", "upstream_error"
                        )
                    for choice in chunk.get("choices") or ():
                        delta = choice.get("delta") or {}
                        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                        if reasoning:
                            yield ReasoningDelta(reasoning)
                        content = delta.get("content")
                        if content:
                            content, held = _whole_characters(held + content)
                        if content:
                            text.append(content)
                            yield TextDelta(content)
                        for fragment in delta.get("tool_calls") or ():
                            _add_fragment(calls, fragment)
                        if choice.get("finish_reason"):
                            finished = True
                    if chunk.get("usage"):
                        u = chunk["usage"]
                        usage = Usage(u.get("prompt_tokens"), u.get("completion_tokens"))
            if not finished:
                raise LLMError(
                    f"the reply from {self.backend.base_url} ended early", "bad_response"
                )
            requests = [_call_request(calls[i]) for i in sorted(calls)]
        except LLMError:
            raise
        except Exception as e:
            raise self.backend.error(e) from e
        reply: Message = {"role": "assistant", "content": "".join(text) or None}
        if requests:
            reply["tool_calls"] = [
                {
                    "id": r.call_id,
                    "type": "function",
                    "function": {"name": r.name, "arguments": r.args_json},
                }
                for r in requests
            ]
        elif reply["content"] is None:
            reply["content"] = ""
        self.messages += [*new, reply]
        for r in requests:
            yield r
        if usage is not None:
            yield usage


def _add_fragment(calls: dict[int, dict[str, Any]], fragment: dict[str, Any]) -> None:
    """Accumulate one streamed tool-call fragment: id and name come first, arguments in parts."""
    call = calls.setdefault(fragment.get("index", len(calls)), {"id": None, "name": "", "args": []})
    if fragment.get("id"):
        call["id"] = fragment["id"]
    function = fragment.get("function") or {}
    if function.get("name"):
        call["name"] += function["name"]
    if function.get("arguments"):
        call["args"].append(function["arguments"])


def _call_request(call: dict[str, Any]) -> ToolCallRequest:
    if not call["name"]:
        raise ValueError("a streamed tool call has no function name")
    call_id = call["id"] or f"call_{uuid.uuid4().hex[:24]}"
    return ToolCallRequest(call_id, call["name"], "".join(call["args"]) or "{}")


def _whole_characters(text: str) -> tuple[str, str]:
    """Split off a trailing high surrogate (its pair is in the next chunk) and replace lone
    surrogates, which no UTF-8 reader (SQLite, an SSE client) accepts."""
    held = ""
    if "\ud800" <= text[-1] <= "\udbff":
        text, held = text[:-1], text[-1]
    try:
        text.encode()
    except UnicodeEncodeError:  # rejoin pairs, replace what is left alone
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text, held


def _error_text(chunk: dict[str, Any]) -> str:
    error = chunk["error"]
    return str(error.get("message") or error) if isinstance(error, dict) else str(error)


def input_message(item: LLMInput) -> Message:
    if isinstance(item, UserInput):
        return {"role": "user", "content": item.text}
    if isinstance(item, ToolResultInput):
        return {"role": "tool", "tool_call_id": item.call_id, "content": item.text}
    raise TypeError(f"unsupported LLM input {type(item).__name__}")


def history_messages(system_prompt: str, history: Sequence[HistoryItem]) -> list[Message]:
    """Working memory as OpenAI messages.

    An assistant's text and the tool calls after it become one assistant message; every tool
    call gets a tool message (a placeholder if none was recorded), as the API requires.
    """
    messages: list[Message] = (
        [{"role": "system", "content": system_prompt}] if system_prompt else []
    )
    pending: list[str] = []  # call ids of the last assistant message still without a result

    def settle() -> None:
        messages.extend({"role": "tool", "tool_call_id": c, "content": NO_RESULT} for c in pending)
        pending.clear()

    for item in history:
        if item.role == "tool_result":
            if item.call_id in pending:
                pending.remove(item.call_id)
                messages.append(
                    {"role": "tool", "tool_call_id": item.call_id, "content": item.text}
                )
            else:  # its call is not in memory (cut by a compaction): keep the text as context
                settle()
                messages.append(
                    {"role": "user", "content": f"[Result of tool {item.tool_name}]\n{item.text}"}
                )
            continue
        if item.role == "tool_call":
            call_id = item.call_id or f"call_{uuid.uuid4().hex[:24]}"
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": item.tool_name or "", "arguments": item.args_json or "{}"},
            }
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                settle()
                last = {"role": "assistant", "content": None}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
            pending.append(call_id)
            continue
        settle()
        if item.role in ("user", "assistant"):
            messages.append({"role": item.role, "content": item.text})
        elif item.role == "summary":
            messages.append({"role": "user", "content": SUMMARY_PREFIX + item.text})
        else:
            log.warning("working-memory item with unknown role %r left out", item.role)
    settle()
    return messages
