"""The ``litert`` LLM backend (alias ``google``): on-device LiteRT-LM through ``litert-lm-api``.

Hooks only: ``litert_lm`` (a 130 MB native library) is imported once this backend is chosen.
The factory checks the model file before any engine exists, because the engine itself only
says "Failed to create" (the reason goes to stderr). Without ``AGENTIK_GOOGLE_MODEL_PATH`` the
model is ``AGENTIK_GOOGLE_MODEL_REPO``/``FILE`` from the cache, fetched from the hub the first
time (``models.py``; ``agentik models pull``/``list``, ``commands.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from agentik.core import settings as cfg
from agentik.core.settings import Setting, Settings
from agentik.hookspecs import hookimpl
from agentik_llm_litert.models import DEFAULT_FILE, DEFAULT_REPO, parse_file, parse_repo

SETTINGS = (
    Setting(
        "AGENTIK_GOOGLE_MODEL_PATH",
        None,
        cfg.parse_path,
        "The `.litertlm` model file for `litert`; unset: AGENTIK_GOOGLE_MODEL_REPO/FILE from "
        "the cache, downloaded on first use.",
    ),
    Setting(
        "AGENTIK_GOOGLE_MODEL_REPO",
        DEFAULT_REPO,
        parse_repo,
        "Hugging Face hub repository of the `litert` model (HF_ENDPOINT, HF_TOKEN apply).",
    ),
    Setting(
        "AGENTIK_GOOGLE_MODEL_FILE",
        DEFAULT_FILE,
        parse_file,
        "The `.litertlm` file in AGENTIK_GOOGLE_MODEL_REPO.",
    ),
    Setting(
        "AGENTIK_MODELS_DIR",
        None,
        cfg.parse_path,
        "Cache of downloaded models (default: $XDG_CACHE_HOME/agentik/models, "
        "i.e. ~/.cache/agentik/models).",
    ),
    Setting(
        "AGENTIK_GOOGLE_CACHE_DIR",
        None,
        cfg.parse_path,
        "Where LiteRT-LM keeps its compiled caches (default: next to the model).",
    ),
    Setting("AGENTIK_GOOGLE_THREADS", 4, cfg.parse_positive_int, "CPU threads of the engine."),
    Setting(
        "AGENTIK_GOOGLE_CONTEXT_WINDOW",
        None,
        cfg.parse_positive_int,
        "Context window in tokens (default: the model's own, read from its header).",
    ),
)


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    for setting in SETTINGS:
        register(setting)


def make_backend(settings: Settings) -> Any:
    from agentik_llm_litert.backend import LiteRtBackend, check_model
    from agentik_llm_litert.models import resolve

    path, source = resolve(settings)  # fetched here, before anything listens, when missing
    backend = LiteRtBackend(
        check_model(path),
        cache_dir=settings["AGENTIK_GOOGLE_CACHE_DIR"],
        threads=settings["AGENTIK_GOOGLE_THREADS"],
        context_window=settings["AGENTIK_GOOGLE_CONTEXT_WINDOW"],
    )
    backend.source = source
    return backend


@hookimpl
def register_llm_backends(register: Callable[..., None]) -> None:
    register("litert", make_backend, aliases=("google",), requires=("litert_lm",), extra="litert")


@hookimpl
def banner_lines(agent: Any, settings: Settings) -> list[str] | None:
    backend = sys.modules.get("agentik_llm_litert.backend")  # loaded only if this one was chosen
    if backend is None or not isinstance(agent.llm, backend.LiteRtBackend):
        return None
    # the core prints ``llm: <description>`` for every backend
    return [
        f"llm model: {agent.llm.model.path} ({agent.llm.source})",
        f"llm capabilities: {agent.llm.capabilities_line()}",
    ]


@hookimpl
def plugin_details(settings: Settings) -> dict[str, Any] | None:
    """For ``agentik plugins``: the model and what its header says it can do."""
    from agentik_llm_litert.models import cached, human, models_dir, partial_size, wanted

    path = settings.get("AGENTIK_GOOGLE_MODEL_PATH")
    report: dict[str, Any] = {}
    if path is None:  # the cache's model: no request is made here
        root, (repo, file) = models_dir(settings), wanted(settings)
        model = cached(root, repo, file)
        report["model"] = f"{repo}/{file}"
        if model is None:
            kept = partial_size(root, repo, file)
            report["cache"] = f"not downloaded yet ({root}): the first serve fetches it" + (
                f", resuming after {human(kept)}" if kept else ""
            )
            return report
        report["cache"] = f"{model.path} ({human(model.size)})"
        path = model.path
    else:
        report["model"] = str(path)
    try:
        from agentik_llm_litert.backend import check_model
    except ImportError as e:
        report["error"] = f"needs litert-lm-api: pip install 'agentik-runtime[litert]' ({e})"
        return report
    from agentik.core.settings import SettingsError

    try:
        report["capabilities"] = check_model(path).capabilities
    except SettingsError as e:
        report["error"] = str(e)
    return report


@hookimpl
def register_commands(register: Callable[..., None]) -> None:
    from agentik_llm_litert import commands

    register(
        "models", commands.setup, commands.run, help="download and list on-device (litert) models"
    )
