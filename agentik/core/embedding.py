"""The embedding contract. A custom embedding backend implements :class:`EmbeddingBackend`.

Backends are registered with ``register_embedding_backends`` and chosen by
``AGENTIK_EMBEDDING_BACKEND``; the core builds the selected one only when something needs it
(the ``vector`` memory backend), so an agent without semantic memory never loads one.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy comes with the backends that use it, not with the core
    import numpy


class EmbeddingError(Exception):
    """An embedding request failed (endpoint down, refused, an answer of the wrong shape).

    Its message is shown to the model as a tool error or logged, so say what is wrong and,
    where a setting is the cause, name the variable."""


class EmbeddingBackend(abc.ABC):
    """Turns a batch of texts into float32 vectors of one known dimension."""

    #: the backend's registered name and the model it runs, for the banner
    name: str = ""
    model: str = ""
    #: the variables that choose the model (and so the dimension), named when stored vectors
    #: were made by another: ``("AGENTIK_EMBEDDING_MODEL", "AGENTIK_EMBEDDING_DIMENSION")``
    model_settings: tuple[str, ...] = ()

    @property
    @abc.abstractmethod
    def dimension(self) -> int:
        """The length of every vector; known once :meth:`start` returned (read from the model,
        or from a setting), before the first text is embedded."""

    async def start(self) -> None:  # noqa: B027 - optional
        """Open what the backend needs (a session, a model file); raise
        :class:`~agentik.core.plugins.StartupError` naming the variable when it cannot."""

    async def close(self) -> None:  # noqa: B027 - optional
        """Release it at shutdown."""

    @abc.abstractmethod
    async def embed(self, texts: Sequence[str]) -> numpy.ndarray:
        """One row per text, in order: a float32 array of shape ``(len(texts), dimension)``.

        Never blocks the event loop (run model inference in a thread); raises
        :class:`EmbeddingError` when it cannot answer."""
