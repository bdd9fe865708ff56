"""Diagnosis for B4's cost-vs-history: the ``openai`` SDK's request transform.

``chat.completions.create`` (and ``with_streaming_response.create``, which the openai backend
uses in plugins/llm_openai/backend.py) runs ``async_maybe_transform`` over the whole request,
walking every message against the TypedDict annotations, on the event loop, on every turn. This
times that one call for a request of 2 / 20 / 100 messages (system + a chat history).

    python bench/profile_sdk_transform.py
"""

from __future__ import annotations

import asyncio
import time

from openai._utils import async_maybe_transform
from openai.types.chat import completion_create_params


async def main() -> None:
    params = completion_create_params.CompletionCreateParamsStreaming
    for n in (2, 20, 100):
        messages = [{"role": "system", "content": "You are a helpful assistant."}] + [
            {"role": "user" if i % 2 == 0 else "assistant", "content": "hello there " * 20}
            for i in range(n - 1)
        ]
        request = {
            "model": "fake-model",
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        for _ in range(10):
            await async_maybe_transform(request, params)
        runs = []
        for _ in range(5):
            c0 = time.process_time()
            for _ in range(50):
                await async_maybe_transform(request, params)
            runs.append((time.process_time() - c0) / 50 * 1e6)
        runs.sort()
        print(f"{n:4d} messages: {runs[2]:8.0f} µs CPU per request (median of 5 x 50)")


if __name__ == "__main__":
    asyncio.run(main())
