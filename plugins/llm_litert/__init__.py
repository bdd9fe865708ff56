"""The ``litert`` LLM backend (alias ``google``): on-device LiteRT-LM through ``litert-lm-api``.

Hooks only: ``litert_lm`` (a 130 MB native library) is imported once this backend is chosen.
The factory checks the model file before any engine exists, because the engine itself only
says "Failed to create" (the reason goes to stderr).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from agentik.core import settings as cfg
from agentik.core.settings import Setting, Settings
from agentik.hookspecs import hookimpl

SETTINGS = (
    Setting(
        "AGENTIK_GOOGLE_MODEL_PATH",
        None,
        cfg.parse_path,
        "Required for `litert`: the `.litertlm` model file.",
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
    settings.require("AGENTIK_GOOGLE_MODEL_PATH")
    from agentik_llm_litert.backend import LiteRtBackend, check_model

    model = check_model(settings["AGENTIK_GOOGLE_MODEL_PATH"])
    return LiteRtBackend(
        model,
        cache_dir=settings["AGENTIK_GOOGLE_CACHE_DIR"],
        threads=settings["AGENTIK_GOOGLE_THREADS"],
        context_window=settings["AGENTIK_GOOGLE_CONTEXT_WINDOW"],
    )


@hookimpl
def register_llm_backends(register: Callable[..., None]) -> None:
    register("litert", make_backend, aliases=("google",), requires=("litert_lm",), extra="litert")


@hookimpl
def banner_lines(agent: Any, settings: Settings) -> list[str] | None:
    backend = sys.modules.get("agentik_llm_litert.backend")  # loaded only if this one was chosen
    if backend is None or not isinstance(agent.llm, backend.LiteRtBackend):
        return None
    # the core prints ``llm: <description>`` for every backend
    return [f"llm capabilities: {agent.llm.capabilities_line()}"]


@hookimpl
def plugin_details(settings: Settings) -> dict[str, Any] | None:
    """For ``agentik plugins``: the model and what its header says it can do."""
    path = settings.get("AGENTIK_GOOGLE_MODEL_PATH")
    if path is None:
        return None
    report: dict[str, Any] = {"model": str(path)}
    try:
        from agentik_llm_litert.backend import check_model
    except ImportError as e:
        report["error"] = f"needs litert-lm-api: pip install 'agentik[litert]' ({e})"
        return report
    from agentik.core.settings import SettingsError

    try:
        report["capabilities"] = check_model(path).capabilities
    except SettingsError as e:
        report["error"] = str(e)
    return report
