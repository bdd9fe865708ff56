"""The ``siglip`` embedding backend: the SigLIP2 text tower on the device (onnxruntime +
sentencepiece), for the ``vector`` memory offline.

Hooks only: onnxruntime, sentencepiece and numpy are imported by ``backend.py``, once this
backend is chosen (``AGENTIK_EMBEDDING_BACKEND=siglip``) or ``agentik plugins`` looks at the
model. What the model expects (tokens, padding, names, normalisation) and where each fact
comes from: docs/embedding_siglip.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentik.core import settings as cfg
from agentik.core.settings import Setting, Settings
from agentik.hookspecs import hookimpl

MODEL_PATH = "AGENTIK_EMBEDDING_MODEL_PATH"
TOKENIZER_PATH = "AGENTIK_EMBEDDING_TOKENIZER_PATH"
THREADS = "AGENTIK_EMBEDDING_THREADS"

SETTINGS = (
    Setting(
        MODEL_PATH,
        None,
        cfg.parse_path,
        "Required for `siglip`: the SigLIP2 text model exported to ONNX (`text_model_int8.onnx`).",
    ),
    Setting(
        TOKENIZER_PATH,
        None,
        cfg.parse_path,
        "Required for `siglip`: the model's SentencePiece tokenizer (`tokenizer.model`).",
    ),
    Setting(THREADS, 2, cfg.parse_positive_int, "CPU threads of the `siglip` embedding model."),
)


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    for setting in SETTINGS:
        register(setting)


def make_backend(settings: Settings) -> Any:
    settings.require(MODEL_PATH, TOKENIZER_PATH)
    from agentik_embedding_siglip.backend import SiglipEmbedding

    return SiglipEmbedding(
        settings[MODEL_PATH], settings[TOKENIZER_PATH], threads=settings[THREADS]
    )


@hookimpl
def register_embedding_backends(register: Callable[..., None]) -> None:
    register(
        "siglip",
        make_backend,
        requires=("onnxruntime", "sentencepiece", "numpy"),
        extra="siglip",
    )


@hookimpl
def plugin_details(settings: Settings) -> dict[str, Any] | None:
    """For ``agentik plugins``: what the model and tokenizer files are, or what is wrong."""
    model, tokenizer = settings.get(MODEL_PATH), settings.get(TOKENIZER_PATH)
    chosen = str(settings.get("AGENTIK_EMBEDDING_BACKEND") or "").strip().lower() == "siglip"
    if model is None and tokenizer is None and not chosen:
        return None
    report: dict[str, Any] = {
        "model": str(model) if model else None,
        "tokenizer": str(tokenizer) if tokenizer else None,
    }
    try:
        from agentik_embedding_siglip.backend import load
    except ImportError as e:
        report["error"] = (
            f"needs onnxruntime and sentencepiece: pip install 'agentik-runtime[siglip]' ({e})"
        )
        return report
    from agentik.core.plugins import StartupError
    from agentik.core.settings import SettingsError

    try:
        settings.require(MODEL_PATH, TOKENIZER_PATH)
        report.update(load(settings[MODEL_PATH], settings[TOKENIZER_PATH], threads=1).facts())
    except (StartupError, SettingsError) as e:
        report["error"] = str(e)
    return report
