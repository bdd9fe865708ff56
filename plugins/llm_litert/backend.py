"""LiteRT-LM as an agentik LLM backend (``litert_lm`` 0.18).

- One engine per process; one LiteRT-LM conversation per agentik conversation, built from
  working memory on first use and kept (its KV cache) for later turns.
- ``send_message_async`` is a *synchronous* generator that blocks while the model runs: each
  step runs it on a worker thread (which also creates the native conversation on the first
  step: no extra thread hop), so the loop never waits on the model. The worker hands chunks
  over through a deque and wakes the loop only when no wake-up is already due, so a burst of
  chunks costs one wake-up, not one each (bench B17: the thread hops were most of agentik's
  overhead per turn on a small model, with the prompt's render+tokenize for the token count).
- Steps are serialised on one engine thread (one generation at a time, whichever
  conversation): the CPU executor gains nothing from two at once, and the native engine is
  only ever entered from that thread (closes excepted, after the step's worker has ended).
- An interrupt cancels the consuming task: the step calls ``cancel_process()``, and the
  conversation is then unusable (LiteRT-LM's rule) until the turn engine rebuilds it. A
  stream dropped at a ``yield`` (no ``finally`` ran yet) is caught at the next step.
- Tool calls are in manual mode (``automatic_tool_calling=False``): the model's calls go to
  agentik's tool loop and the results come back as one ``tool`` message.
- Shutdown closes every conversation (after its worker has stopped) before the engine;
  otherwise the process may abort at exit.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import json
import logging
import os
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import litert_lm  # this module is imported only once the litert backend is chosen

from agentik.core.llm import (
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
from agentik.core.settings import SettingsError
from agentik.core.tools import ToolSpec
from agentik.core.types import ImagePart

log = logging.getLogger(__name__)
# the native library logs every load step at INFO on stderr; its errors still show
litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)

VARIABLE = "AGENTIK_GOOGLE_MODEL_PATH"
MAGIC = b"LITERTLM"
_DONE = object()


@dataclass(frozen=True)
class ModelFacts:
    """What the model's header says, read before any engine exists."""

    path: Path
    context_tokens: int | None
    capabilities: dict[str, Any] = field(default_factory=dict)
    #: the context size can be chosen at load time (else context_tokens is fixed)
    dynamic_context: bool = False


def check_model(path: Path) -> ModelFacts:
    """Check the model file and read its header; raise SettingsError saying what is wrong."""
    where = f"{VARIABLE}={str(path)!r}"
    if not path.exists():
        raise SettingsError(f"{where}: no such file")
    if path.is_dir():
        raise SettingsError(f"{where}: is a directory, not a .litertlm model file")
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC))
    except OSError as e:
        raise SettingsError(f"{where}: cannot be read: {e.strerror or e}") from e
    if head != MAGIC:
        raise SettingsError(
            f"{where}: not a LiteRT-LM model (a .litertlm file starts with {MAGIC.decode()})"
        )
    try:
        info = litert_lm.ModelInfo(str(path))
    except Exception as e:  # the native loader says only "failed"
        raise SettingsError(f"{where}: not a valid LiteRT-LM model ({e})") from e
    try:
        if not info.is_llm_model or info.llm is None:
            raise SettingsError(
                f"{where}: not a language model (model type {info.model_type.name.lower()})"
            )
        modalities = info.input_modalities
        context = info.max_context_tokens
        dynamic = bool(info.is_dynamic_context)
        caps = {
            "text_input": bool(modalities.text),
            "image_input": bool(modalities.vision),
            "audio_input": bool(modalities.audio),
            "video_input": bool(modalities.video),
            "thinking": bool(info.llm.supports_thinking()),
            "function_calling": bool(info.llm.supports_function_calling()),
            "context_tokens": context if context > 0 else None,
        }
    finally:
        info.close()
    return ModelFacts(path, caps["context_tokens"], caps, dynamic)


class _Tool(litert_lm.Tool):  # type: ignore[misc]
    """A tool as LiteRT-LM wants it; in manual mode it is described, never executed here."""

    def __init__(self, spec: ToolSpec) -> None:
        self.spec = spec

    def get_tool_description(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.spec.name,
                "description": self.spec.description,
                "parameters": self.spec.parameters,
            },
        }

    def execute(self, param: Any) -> Any:  # pragma: no cover - manual tool calling only
        raise RuntimeError("agentik runs tools itself (automatic_tool_calling=False)")


def _args(args_json: str | None) -> Any:
    try:
        return json.loads(args_json or "{}")
    except ValueError:
        return {}


def history_messages(history: Sequence[HistoryItem]) -> list[dict[str, Any]]:
    """Working memory as LiteRT-LM messages (the system prompt goes separately)."""
    messages: list[dict[str, Any]] = []
    for item in history:
        if item.role == "user":
            messages.append(user_message(item.text, history_images(item)))
        elif item.role == "assistant":
            messages.append({"role": item.role, "content": item.text})
        elif item.role == "summary":
            messages.append({"role": "user", "content": SUMMARY_PREFIX + item.text})
        elif item.role == "tool_call":
            call = {
                "type": "function",
                "function": {"name": item.tool_name or "", "arguments": _args(item.args_json)},
            }
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif item.role == "tool_result":
            response = {
                "type": "tool_response",
                "name": item.tool_name or "",
                "response": item.text,
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "tool":
                last["content"].append(response)
            else:
                messages.append({"role": "tool", "content": [response]})
        else:
            log.warning("working-memory item with unknown role %r left out", item.role)
    return messages


def input_message(inputs: Sequence[LLMInput]) -> dict[str, Any]:
    """One step's inputs as one LiteRT-LM message (tool results together in one)."""
    results = [i for i in inputs if isinstance(i, ToolResultInput)]
    if results:
        content = [
            {"type": "tool_response", "name": r.tool_name, "response": r.text} for r in results
        ]
        return {"role": "tool", "content": content}
    users = [i for i in inputs if isinstance(i, UserInput)]
    if len(users) != len(inputs):
        raise TypeError(f"unsupported LLM inputs {[type(i).__name__ for i in inputs]}")
    images = [image for i in users for image in i.images]
    return user_message("\n\n".join(i.text for i in users), images)


def user_message(text: str, images: Sequence[ImagePart] = ()) -> dict[str, Any]:
    """A user message; with images (a vision model), image parts with their bytes first."""
    if not images:
        return {"role": "user", "content": text}
    if any(image.data is None for image in images):  # send() refuses these (image_url_input)
        raise LLMError("a LiteRT-LM model takes images as data, not as a URL", "bad_request")
    parts: list[dict[str, Any]] = [{"type": "image", "blob": image.data} for image in images]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


def message_chunks(message: Any) -> list[LLMChunk]:
    """One streamed LiteRT-LM message as agentik chunks."""
    out: list[LLMChunk] = []
    for _channel, text in (getattr(message, "channels", None) or {}).items():
        if text:
            out.append(ReasoningDelta(text))
    for content in getattr(message, "contents", None) or ():
        text = getattr(content, "text", None)
        if isinstance(text, str) and text:
            out.append(TextDelta(text))
    for call in getattr(message, "tool_calls", None) or ():
        out.append(
            ToolCallRequest(
                call.id or f"call_{uuid.uuid4().hex[:24]}",
                call.name,
                json.dumps(call.arguments, ensure_ascii=False),
            )
        )
    return out


class LiteRtConversation(LLMConversation):
    """One live LiteRT-LM conversation (created lazily, on the first step)."""

    def __init__(
        self,
        backend: LiteRtBackend,
        system_prompt: str,
        history: Sequence[HistoryItem],
        tools: Sequence[ToolSpec],
        max_output_tokens: int | None = None,
    ) -> None:
        self._backend = backend
        self._max_output_tokens = max_output_tokens  # a one-shot call's cap
        self._system_prompt, history = fold_summaries(system_prompt, history)
        self._messages = history_messages(history)
        self._tools = [_Tool(t) for t in tools]
        self._conv: Any = None
        self._worker: concurrent.futures.Future[None] | None = None
        self._broken: str | None = None
        self._step_open = False
        self._closed = False

    @property
    def native(self) -> Any:
        """The ``litert_lm.Conversation`` (None before the first step); for tests."""
        return self._conv

    def _create(self) -> Any:
        return self._backend.engine.create_conversation(
            messages=self._messages or None,
            system_message=self._system_prompt or None,
            tools=self._tools or None,
            automatic_tool_calling=False,
            max_output_tokens=self._max_output_tokens,
        )

    async def stream(self, inputs: Sequence[LLMInput]) -> AsyncIterator[LLMChunk]:
        if self._closed:
            raise LLMError("the LiteRT-LM conversation is closed", "litert")
        if self._step_open and self._conv is not None:
            # the last step's stream was dropped unfinished (its consumer was cancelled while
            # the generator sat at a yield): its generation is cut, as an interrupt would
            self._broken = "an earlier reply was cut off"
            self._conv.cancel_process()
        if self._broken:
            raise LLMError(f"the LiteRT-LM conversation is unusable: {self._broken}", "litert")
        if inputs:
            message = input_message(inputs)
        elif self._conv is None and self._messages and self._messages[-1]["role"] == "tool":
            # just rebuilt from memory that ends with this step's tool results: they are the
            # message the model answers
            message = self._messages.pop()
        else:
            raise LLMError("nothing to send to the LiteRT-LM conversation", "litert")
        backend = self._backend
        loop = asyncio.get_running_loop()
        if self._conv is None:
            backend.live.add(self)  # its close waits for the worker that creates it
        # the worker hands items over through a deque and wakes the loop only when it is not
        # already due to wake: a reply's chunks cost one or a few loop wake-ups, not one each
        pending: collections.deque[Any] = collections.deque()
        lock = threading.Lock()
        ready = asyncio.Event()
        due = False

        def put(item: Any) -> None:
            nonlocal due
            with lock:
                pending.append(item)
                if due:
                    return
                due = True
            # a RuntimeError: the loop is gone (shutdown), nobody is listening
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(ready.set)

        def generate() -> None:
            try:
                conv = self._conv
                if conv is None:  # the first step: create it here, no extra thread hop
                    try:
                        conv = self._conv = self._create()
                    except Exception as e:
                        put(e)
                        return
                    if self._broken:  # cancelled while it was being created
                        return
                prompt = self._prompt_tokens(conv, message)
                for msg in conv.send_message_async(message):
                    chunks = message_chunks(msg)
                    if chunks:
                        put(chunks)
                put(self._usage(conv, prompt))
            except BaseException as e:
                put(e)
            finally:
                put(_DONE)

        # one worker thread: steps of all conversations run one at a time, in order
        self._step_open = True
        self._worker = backend.executor.submit(generate)
        try:
            while True:
                await ready.wait()
                with lock:
                    ready.clear()
                    due = False
                    items = list(pending)
                    pending.clear()
                for item in items:
                    if item is _DONE:
                        self._step_open = False
                        return
                    if isinstance(item, BaseException):
                        self._broken = str(item)
                        if self._conv is None:  # it could not be created: nothing to cancel
                            self._step_open = False
                        raise LLMError(f"LiteRT-LM: {item}", "litert") from item
                    if isinstance(item, list):
                        for chunk in item:
                            yield chunk
                    else:
                        yield item
        finally:
            if self._step_open:  # cancelled (an interrupt) or closed before its end
                self._broken = "its reply was cancelled"
                if not self._worker.cancel():  # not queued any more: stop the running step
                    conv = self._conv
                    if conv is not None:
                        conv.cancel_process()

    def _prompt_tokens(self, conv: Any, message: dict[str, Any]) -> int | None:
        """The context's size once ``message`` is in (as rendered, with the reply's prefix)."""
        try:
            rendered = conv.render_message_to_string(message)
            return int(conv.token_count) + len(self._backend.engine.tokenize(rendered))
        except Exception:
            return None

    @staticmethod
    def _usage(conv: Any, prompt: int | None) -> Usage:
        """Input: the whole context the model read; output: what it added (its end included)."""
        try:
            total = int(conv.token_count)
        except Exception:
            return Usage(None, None)
        if prompt is None or prompt > total:
            return Usage(None, None)
        return Usage(prompt, total - prompt)

    def token_count(self) -> int | None:
        try:
            return int(self._conv.token_count) if self._conv is not None else None
        except Exception:
            return None

    def close_sync(self) -> None:
        """Wait for the worker, then free the native conversation (from any thread)."""
        self._closed = True
        worker, self._worker = self._worker, None
        if worker is not None:
            conv = self._conv
            if conv is not None and not worker.cancel() and not worker.done():
                conv.cancel_process()
            with contextlib.suppress(BaseException):  # cancelled, or its error was reported
                worker.result(timeout=30)
        conv, self._conv = self._conv, None
        if conv is not None:
            conv.close()
        self._backend.live.discard(self)

    async def aclose(self) -> None:
        if self._closed:
            return
        await asyncio.get_running_loop().run_in_executor(None, self.close_sync)


class LiteRtBackend(LLMBackend):
    def __init__(
        self,
        model: ModelFacts,
        *,
        cache_dir: Path | None = None,
        threads: int = 4,
        context_window: int | None = None,
    ) -> None:
        self.model = model
        self.cache_dir = cache_dir
        self.threads = threads
        self.capabilities = dict(model.capabilities, image_url_input=False)  # data only
        limit = model.context_tokens
        if context_window is not None and limit is not None and not model.dynamic_context:
            context_window = min(context_window, limit)  # a fixed context cannot grow
        self.context_window = context_window or limit
        self.description = f"litert {model.path.name} (cpu, {threads} threads)"
        #: where the model comes from, for the banner (the plugin's factory sets it)
        self.source = VARIABLE
        self.engine: Any = None
        # every native call but close runs on this one thread: steps of all conversations run
        # one at a time (the CPU executor gains nothing from two at once)
        self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="litert")
        self.live: set[LiteRtConversation] = set()
        self._close_lock = threading.Lock()

    def capabilities_line(self) -> str:
        caps = self.capabilities or {}
        inputs = [m for m in ("text", "image", "audio", "video") if caps.get(f"{m}_input")]
        flags = [f for f in ("thinking", "function_calling") if caps.get(f)]
        ctx = caps.get("context_tokens")
        return ", ".join(
            [f"input {'+'.join(inputs) or 'none'}", *flags, f"context {ctx or 'unknown'}"]
        )

    def _make_engine(self) -> Any:
        if self.cache_dir is not None:
            os.makedirs(self.cache_dir, exist_ok=True)
        kwargs: dict[str, Any] = {}
        if self.cache_dir is not None:
            kwargs["cache_dir"] = str(self.cache_dir)
        if self.context_window is not None and self.context_window != self.model.context_tokens:
            kwargs["max_num_tokens"] = self.context_window
        if self.model.capabilities.get("image_input"):  # a vision model: its image encoder
            kwargs["vision_backend"] = litert_lm.Backend.CPU(thread_count=self.threads)
        return litert_lm.Engine(
            str(self.model.path),
            backend=litert_lm.Backend.CPU(thread_count=self.threads),
            **kwargs,
        )

    async def start(self) -> None:
        if self.engine is not None:
            return
        try:
            self.engine = await asyncio.get_running_loop().run_in_executor(
                self.executor, self._make_engine
            )
        except Exception as e:
            raise RuntimeError(
                f"{VARIABLE}={str(self.model.path)!r}: LiteRT-LM could not load the model: {e}"
            ) from e

    def close_sync(self) -> None:
        """Conversations first (each after its step has stopped), then the engine thread, then
        the engine: the other order can abort the process at exit."""
        with self._close_lock:
            for conv in list(self.live):
                conv.close_sync()
            self.executor.shutdown(wait=True, cancel_futures=True)
            engine, self.engine = self.engine, None
            if engine is not None:
                engine.close()

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close_sync)

    def create_conversation(
        self, system_prompt: str, history: Sequence[HistoryItem], tools: Sequence[ToolSpec]
    ) -> LiteRtConversation:
        if self.engine is None:
            raise LLMError("the LiteRT-LM engine is not started", "litert")
        return LiteRtConversation(self, system_prompt, history, tools)

    async def complete(self, prompt: str, *, system_prompt: str | None = None) -> str:
        return (await self.one_shot(prompt, system_prompt=system_prompt)).text

    async def one_shot(
        self, prompt: str, *, system_prompt: str | None = None, max_tokens: int | None = None
    ) -> Completion:
        """A conversation of its own, capped at ``max_tokens`` (``max_output_tokens``)."""
        if self.engine is None:
            raise LLMError("the LiteRT-LM engine is not started", "litert")
        conv = LiteRtConversation(self, system_prompt or "", [], [], max_output_tokens=max_tokens)
        parts: list[str] = []
        usage: Usage | None = None
        truncated = False
        try:
            async for chunk in conv.stream([UserInput(prompt)]):
                if isinstance(chunk, TextDelta):
                    parts.append(chunk.text)
                elif isinstance(chunk, Usage):
                    usage = chunk
                elif isinstance(chunk, Truncated):
                    truncated = True
        finally:
            await conv.aclose()
        return Completion("".join(parts), usage, truncated)
