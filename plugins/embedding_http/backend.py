"""The ``http`` embedding backend: POST ``{"model", "input": [texts], "dimensions"}`` to
``{OPENAI_BASE_URL}/embeddings`` (the base URL already ends in ``/v1``, as for the chat
endpoint), through the ``openai`` backend's client: its retries on 429/5xx/no reply with
back-off or ``Retry-After``, its timeout and its one-sentence errors.

Texts already embedded come from an LRU cache (256 texts: the prefetch and the review embed the
same user text and facts more than once); the others go in one request (up to
:data:`MAX_BATCH` texts each). A large reply is parsed in a thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy

from agentik.core.embedding import EmbeddingBackend, EmbeddingError
from agentik.core.llm import LLMError
from agentik_llm_openai.client import OpenAIClient

CACHE_SIZE = 256
MAX_BATCH = 2048  # inputs per request OpenAI accepts
THREAD_PARSE = 256 * 1024  # reply bytes parsed in a thread (a few dozen 1536-d vectors)


def takes_dimensions(model: str) -> bool:
    """OpenAI's text-embedding-3 models shorten their vectors to ``dimensions``; others (ada-002,
    most local servers) refuse or ignore the field, so it is not sent to them."""
    return model.startswith("text-embedding-3")


class HttpEmbedding(EmbeddingBackend):
    name = "http"
    model_settings = ("AGENTIK_EMBEDDING_MODEL", "AGENTIK_EMBEDDING_DIMENSION")

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        dimension: int,
        timeout: float = 60.0,
        max_retries: int = 2,
        cache_size: int = CACHE_SIZE,
    ) -> None:
        self.model = model
        self._dimension = dimension
        self.client = OpenAIClient(
            base_url,
            api_key,
            timeout=timeout,
            max_retries=max_retries,
            path="/embeddings",
            what="embedding server",
        )
        self.cache_size = cache_size
        self._cache: OrderedDict[str, numpy.ndarray] = OrderedDict()

    @property
    def dimension(self) -> int:
        return self._dimension

    async def start(self) -> None:
        await self.client.start()

    async def close(self) -> None:
        await self.client.aclose()

    async def embed(self, texts: Sequence[str]) -> numpy.ndarray:
        out = numpy.empty((len(texts), self._dimension), dtype=numpy.float32)
        missing: dict[str, list[int]] = {}  # text -> its rows, each distinct text asked once
        for row, text in enumerate(texts):
            cached = self._cache.get(text)
            if cached is None:
                missing.setdefault(text, []).append(row)
            else:
                self._cache.move_to_end(text)
                out[row] = cached
        asked = list(missing)
        for start in range(0, len(asked), MAX_BATCH):
            batch = asked[start : start + MAX_BATCH]
            for text, vector in zip(batch, await self._request(batch), strict=True):
                for row in missing[text]:
                    out[row] = vector
                self._remember(text, vector)
        return out

    def _remember(self, text: str, vector: numpy.ndarray) -> None:
        self._cache[text] = vector
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    async def _request(self, texts: list[str]) -> numpy.ndarray:
        body: dict[str, Any] = {"model": self.model, "input": texts}
        if takes_dimensions(self.model):
            body["dimensions"] = self._dimension
        try:
            async with self.client.post(body) as resp:
                raw = await resp.read()
        except LLMError as e:
            raise EmbeddingError(e.message) from e
        try:
            if len(raw) > THREAD_PARSE:
                return await asyncio.to_thread(self._vectors, raw, len(texts))
            return self._vectors(raw, len(texts))
        except (ValueError, KeyError, TypeError) as e:
            raise EmbeddingError(
                f"the embedding server {self.client.url} sent a malformed reply: {e}"
            ) from e

    def _vectors(self, raw: bytes, count: int) -> numpy.ndarray:
        data = json.loads(raw)["data"]
        if len(data) != count:
            raise ValueError(f"{len(data)} vectors for {count} texts")
        rows = [item["embedding"] for item in sorted(data, key=lambda item: item["index"])]
        lengths = {len(r) for r in rows}
        if lengths != {self._dimension}:
            got = ", ".join(map(str, sorted(lengths)))
            raise EmbeddingError(
                f"the embedding model {self.model} answered vectors of length {got}, not "
                f"AGENTIK_EMBEDDING_DIMENSION={self._dimension}; set it to the model's dimension"
            )
        return numpy.asarray(rows, dtype=numpy.float32)
