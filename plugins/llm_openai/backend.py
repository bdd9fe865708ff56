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

from agentik.core.context import text_weight
from agentik.core.llm import (
    SILENT_REFUSAL,
    SUMMARY_PREFIX,
    Completion,
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
    Truncated,
    Usage,
    UserInput,
    fold_summaries,
    history_images,
)
from agentik.core.tools import ToolSpec
from agentik.core.types import ImagePart
from agentik_llm_openai.client import STREAM_CUT, OpenAIClient, context_length_error

log = logging.getLogger(__name__)

Message = dict[str, Any]
NO_RESULT = "Error: no result was recorded for this tool call."
TOOLS_NOT_STREAMED_ADVICE = (
    "if it cannot stream replies when tools are offered (llama-cpp-python cannot), "
    "set OPENAI_TOOL_STREAMING=false"
)
# llama-cpp-python answers a streamed request 200 at once, then ends the stream without a word
# on any refusal (a context too long, tools it cannot stream): the reason is only in its log
NO_REPLY = "the model server ended the stream without a reply (its log says why)"
ENDED_EARLY = "the model server ended the reply early"
TOOLS_NOT_STREAMED = f"{NO_REPLY}; {TOOLS_NOT_STREAMED_ADVICE}"


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
        max_tokens: int | None = None,
        tool_streaming: bool = True,
        image_input: bool = False,
    ) -> None:
        self.base_url, self.api_key, self.model = base_url, api_key, model
        self.model_name = model
        self.timeout, self.max_retries = timeout, max_retries
        self.context_window = context_window
        self.max_tokens = max_tokens  # the output-token cap of one step (None: the server's)
        self.tool_streaming = tool_streaming  # False: steps that offer tools are not streamed
        # the API cannot say whether the model takes images: a setting does
        self.capabilities = {"image_input": True} if image_input else None
        self.description = f"openai {model} @ {base_url}"
        self.client = OpenAIClient(
            base_url,
            api_key,
            timeout=timeout,
            max_retries=max_retries,
            context_window=context_window,
        )

    async def start(self) -> None:
        await self.client.start()

    async def aclose(self) -> None:
        await self.client.aclose()

    def create_conversation(
        self, system_prompt: str, history: Sequence[HistoryItem], tools: Sequence[ToolSpec]
    ) -> OpenAIConversation:
        summaries, history = fold_summaries("", history)
        conv = OpenAIConversation(self, history_messages("", history), tools, summaries)
        conv.put_system_prompt(system_prompt)
        return conv

    async def complete(self, prompt: str, *, system_prompt: str | None = None) -> str:
        return (await self.one_shot(prompt, system_prompt=system_prompt)).text

    async def one_shot(
        self, prompt: str, *, system_prompt: str | None = None, max_tokens: int | None = None
    ) -> Completion:
        """Not streamed (llama-cpp-python reports ``usage`` only then), capped at ``max_tokens``
        (else ``OPENAI_MAX_TOKENS``), and a timed-out request is not sent again: a background
        call that took that long would only take as long again, with the user waiting."""
        messages: list[Message] = [{"role": "user", "content": prompt}]
        if system_prompt:
            messages.insert(0, {"role": "system", "content": system_prompt})
        request: dict[str, Any] = {"model": self.model, "messages": messages}
        cap = max_tokens if max_tokens is not None else self.max_tokens
        if cap is not None:
            request["max_tokens"] = cap
        response = await self.client.complete(request, retry_timeouts=False)
        try:
            choices = response["choices"]
            if not choices:
                raise LLMError(f"{self.base_url} answered with no choices", "bad_response")
            return Completion(
                choices[0]["message"]["content"] or "",
                _usage(response.get("usage")),
                choices[0].get("finish_reason") == "length",
            )
        except LLMError:
            raise
        except Exception as e:
            raise self.error(e) from e

    def error(self, e: Exception) -> LLMError:
        """Map an error in reading a reply (the client maps HTTP ones) to an :class:`LLMError`:
        one sentence for the user, the details in the log."""
        if isinstance(e, ValueError | TypeError | AttributeError | KeyError | IndexError):
            # json.JSONDecodeError, or a chunk of the wrong shape
            log.warning("unreadable reply from %s: %s: %s", self.base_url, type(e).__name__, e)
            return LLMError("the model server sent a reply that could not be read", "bad_response")
        log.warning("unexpected error from the model endpoint %s", self.base_url, exc_info=e)
        return LLMError("the model call failed unexpectedly", "llm_error")

    def stream_error(self, message: str) -> LLMError:
        """An error the server reported inside a stream that had started."""
        log.warning("the model server %s reported an error mid-reply: %s", self.base_url, message)
        return context_length_error(message, self.context_window) or LLMError(
            f"the model server reported an error: {message}", "upstream_error"
        )


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


class EncodedMessages:
    """The JSON of a chat's ``messages``, each message encoded once. A request at turn 300
    carries ~600 messages (~360 kB) that only grow at the end until a compaction starts a new
    conversation (the system prompt at the front aside): a request encodes only the messages
    it has not seen (told apart by identity: they are never changed in place), and the body is
    copied once, by one ``join``."""

    def __init__(self) -> None:
        self._messages: list[Message] = []
        self._json: list[bytes] = []  # each message's JSON after a comma

    def parts(self, messages: Sequence[Message]) -> list[bytes]:
        """``messages`` as the items of a JSON array: pieces to join with no separator."""
        seen, parts = self._messages, self._json
        for i, message in enumerate(messages):
            if i == len(seen):
                seen.append(message)
                parts.append(b"," + _dumps(message).encode())
            elif seen[i] is not message:
                seen[i] = message
                parts[i] = b"," + _dumps(message).encode()
        del seen[len(messages) :], parts[len(messages) :]
        return [parts[0][1:], *parts[1:]] if parts else []


def encode_request(request: dict[str, Any], messages: EncodedMessages) -> bytes:
    """``json.dumps(request, separators=(",", ":")).encode()``, its ``messages`` from their
    cache: the same bytes."""
    pieces = [b"{"]
    for key, value in request.items():
        if len(pieces) > 1:
            pieces.append(b",")
        if key == "messages":
            pieces += [b'"messages":[', *messages.parts(value), b"]"]
        else:
            pieces.append(f"{_dumps(key)}:{_dumps(value)}".encode())
    pieces.append(b"}")
    return b"".join(pieces)


class OpenAIConversation(LLMConversation):
    """Holds the OpenAI ``messages`` of one chat; a reply is appended only once it completed."""

    def __init__(
        self,
        backend: OpenAIBackend,
        messages: list[Message],
        tools: Sequence[ToolSpec],
        summaries: str = "",
    ) -> None:
        self.backend = backend
        self.messages = messages
        self._encoded = EncodedMessages()
        #: the summaries that opened working memory, kept after the system prompt (see
        #: agentik.core.llm.fold_summaries)
        self.summaries = summaries
        self._tools_weight: int | None = None  # for usage estimates; counted when first needed
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

    def put_system_prompt(self, system_prompt: str) -> None:
        """The first message: the system prompt, then the summaries (none when both are empty)."""
        text = "\n\n".join(p for p in (system_prompt, self.summaries) if p)
        has = bool(self.messages) and self.messages[0]["role"] == "system"
        if text and has:
            self.messages[0] = {"role": "system", "content": text}
        elif text:
            self.messages.insert(0, {"role": "system", "content": text})
        elif has:
            del self.messages[0]

    async def set_system_prompt(self, system_prompt: str) -> bool:
        self.put_system_prompt(system_prompt)  # the history stays: only its first message
        return True

    def stream(self, inputs: Sequence[LLMInput]) -> AsyncIterator[LLMChunk]:
        return self._stream(inputs, self.tools)

    def stream_without_tools(self, inputs: Sequence[LLMInput]) -> AsyncIterator[LLMChunk]:
        """The request leaves ``tools`` out (the history's tool calls and results stay)."""
        return self._stream(inputs, [])

    async def _stream(
        self, inputs: Sequence[LLMInput], tools: list[dict[str, Any]]
    ) -> AsyncIterator[LLMChunk]:
        backend = self.backend
        new = [input_message(i) for i in inputs]
        messages = self.messages + new
        request: dict[str, Any] = {"model": backend.model, "messages": messages}
        if backend.max_tokens is not None:
            request["max_tokens"] = backend.max_tokens
        if tools:  # "auto" is OpenAI's default; llama-cpp-python renders no tools without it
            request["tools"], request["tool_choice"] = tools, "auto"
        whole = tools and not backend.tool_streaming  # servers that cannot stream tools
        if not whole:
            request["stream"] = True
            request["stream_options"] = {"include_usage": True}
        body = encode_request(request, self._encoded)
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        usage: Usage | None = None
        finish: str | None = None
        held = ""  # a high surrogate whose pair comes in the next chunk
        reasoning_chars = 0  # for a usage estimate
        try:
            if whole:
                response = await backend.client.complete(body)
                choice = response["choices"][0]
                message = choice["message"]
                reasoning = message.get("reasoning_content") or message.get("reasoning")
                if reasoning:
                    reasoning_chars += len(reasoning)
                    yield ReasoningDelta(reasoning)
                content = message.get("content")
                if content and (content := _whole_characters(content)[0]):
                    text.append(content)
                    yield TextDelta(content)
                for i, call in enumerate(message.get("tool_calls") or ()):
                    _add_fragment(calls, {"index": i, **call})
                finish = choice.get("finish_reason") or "stop"
                usage = _usage(response.get("usage"))
            else:
                async with aclosing(backend.client.stream(body)) as lines:
                    async for data in lines:
                        if data == b"[DONE]":
                            finish = finish or "stop"
                            break
                        chunk = json.loads(data.decode())  # bytes: json sniffs the encoding
                        if "error" in chunk:
                            raise backend.stream_error(_error_text(chunk))
                        for choice in chunk.get("choices") or ():
                            delta = choice.get("delta") or {}
                            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                            if reasoning:
                                reasoning_chars += len(reasoning)
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
                                finish = choice["finish_reason"]
                        if chunk.get("usage"):
                            usage = _usage(chunk["usage"])
            if finish is None:
                raise LLMError(ENDED_EARLY, "bad_response")
            requests = [_call_request(calls[i]) for i in sorted(calls)]
        except LLMError as e:
            if not whole and not text and not calls:
                if e.message in (STREAM_CUT, ENDED_EARLY):  # a 200, then no reply: a refusal
                    # of a context too long, or (with tools) of streaming a tool call
                    refused = TOOLS_NOT_STREAMED if tools else NO_REPLY
                    raise LLMError(refused, SILENT_REFUSAL) from e
                if tools and "stream" in e.message and "tool" in e.message:
                    raise LLMError(f"{e.message}; {TOOLS_NOT_STREAMED_ADVICE}", e.code) from e
            raise
        except Exception as e:
            raise backend.error(e) from e
        reply_message: Message = {"role": "assistant", "content": "".join(text)}
        if requests:
            reply_message["tool_calls"] = [
                {
                    "id": r.call_id,
                    "type": "function",
                    "function": {"name": r.name, "arguments": r.args_json},
                }
                for r in requests
            ]
        self.messages += [*new, reply_message]
        for r in requests:
            yield r
        if finish == "length":
            yield Truncated()
        yield usage or self._estimate(
            request["messages"], bool(tools), reply_message, reasoning_chars
        )

    def _estimate(
        self, sent: list[Message], tools: bool, reply: Message, reasoning_chars: int
    ) -> Usage:
        """Usage when the endpoint sent none: the estimate of :mod:`agentik.core.context` (4
        ASCII characters a token, other scripts counted higher) of the messages and tools sent
        and of the reply received (docs/llm_servers.md)."""
        if self._tools_weight is None:
            self._tools_weight = (
                text_weight(json.dumps(self.tools, ensure_ascii=False)) if self.tools else 0
            )
        weight = (self._tools_weight if tools else 0) + sum(map(_message_weight, sent))
        return Usage(
            max(1, weight // 4),
            max(1, (_message_weight(reply) + reasoning_chars) // 4),
            estimated=True,
        )


def _message_weight(message: Message) -> int:
    """A message's text in quarter tokens (:func:`text_weight`; images are not counted)."""
    content = message.get("content")
    if isinstance(content, str):
        n = text_weight(content)
    else:  # parts: text and images
        n = sum(text_weight(p.get("text", "")) for p in content or ())
    for call in message.get("tool_calls") or ():
        n += len(call["function"]["name"]) + text_weight(call["function"]["arguments"])
    return n


def _usage(raw: Any) -> Usage | None:
    if not raw:
        return None
    return Usage(raw.get("prompt_tokens"), raw.get("completion_tokens"))


def _add_fragment(calls: dict[int, dict[str, Any]], fragment: dict[str, Any]) -> None:
    """Accumulate one streamed tool-call fragment: id and name come first, arguments in parts.

    A name (or id) equal to the one already held is the same one repeated, as llama-cpp-python
    sends it in every fragment, not a part to append."""
    call = calls.setdefault(fragment.get("index", len(calls)), {"id": None, "name": "", "args": []})
    if fragment.get("id"):
        call["id"] = fragment["id"]
    function = fragment.get("function") or {}
    name = function.get("name")
    if name and name != call["name"]:
        call["name"] += name
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


def user_message(text: str, images: Sequence[ImagePart] = ()) -> Message:
    """A user message; with images, content parts whose images are ``image_url``s (inline
    ones as ``data:`` URLs)."""
    if not images:
        return {"role": "user", "content": text}
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for image in images:
        url = image.url or f"data:{image.mime_type};base64,{image.data}"
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return {"role": "user", "content": parts}


def input_message(item: LLMInput) -> Message:
    if isinstance(item, UserInput):
        return user_message(item.text, item.images)
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
                last = {"role": "assistant", "content": ""}  # not null: llama-cpp-python 500s
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
            pending.append(call_id)
            continue
        settle()
        if item.role == "user":
            messages.append(user_message(item.text, history_images(item)))
        elif item.role == "assistant":
            messages.append({"role": item.role, "content": item.text})
        elif item.role == "summary":
            messages.append({"role": "user", "content": SUMMARY_PREFIX + item.text})
        else:
            log.warning("working-memory item with unknown role %r left out", item.role)
    settle()
    return messages
