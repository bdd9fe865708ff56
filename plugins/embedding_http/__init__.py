"""The ``http`` embedding backend (the default): the OpenAI-compatible ``/embeddings`` endpoint
of ``OPENAI_BASE_URL``, with the same key, timeout and retries as the ``openai`` LLM backend
(its HTTP client is shared, ``agentik_llm_openai.client``). Hooks only: ``backend.py`` (and
numpy) is imported once this backend is chosen by a memory backend that needs embeddings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentik.core import settings as cfg
from agentik.core.settings import Setting, Settings
from agentik.hookspecs import hookimpl
from agentik_llm_openai import SETTINGS as OPENAI_SETTINGS

SHARED = ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_TIMEOUT", "OPENAI_MAX_RETRIES")
SETTINGS = (
    Setting(
        "AGENTIK_EMBEDDING_MODEL",
        "text-embedding-3-small",
        str,
        "Embedding model of the `http` embedding backend (POST {OPENAI_BASE_URL}/embeddings).",
    ),
    Setting(
        "AGENTIK_EMBEDDING_DIMENSION",
        1536,
        cfg.parse_positive_int,
        "Vector length of the `http` embedding backend; sent as `dimensions` to "
        "text-embedding-3 models, checked against every reply.",
    ),
    # shared with the openai LLM backend: its own declarations, so the two never drift apart
    *(s for s in OPENAI_SETTINGS if s.name in SHARED),
)


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    for setting in SETTINGS:
        register(setting)


def make_backend(settings: Settings) -> Any:
    settings.require(
        "OPENAI_API_KEY",
        hint="the http embedding backend posts to {OPENAI_BASE_URL}/embeddings "
        "(or choose another with AGENTIK_EMBEDDING_BACKEND)",
    )
    from agentik_embedding_http.backend import HttpEmbedding

    return HttpEmbedding(
        base_url=settings["OPENAI_BASE_URL"],
        api_key=settings["OPENAI_API_KEY"],
        model=settings["AGENTIK_EMBEDDING_MODEL"],
        dimension=settings["AGENTIK_EMBEDDING_DIMENSION"],
        timeout=settings["OPENAI_TIMEOUT"],
        max_retries=settings["OPENAI_MAX_RETRIES"],
    )


@hookimpl
def register_embedding_backends(register: Callable[..., None]) -> None:
    register("http", make_backend, requires=("numpy",), extra="vector")
