"""Backends registered by name, then chosen by an ``AGENTIK_*`` variable.

Selection never depends on plugin order: a name registered twice is an error naming both
plugins, and an unknown name is an error listing what is available.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol


class BackendError(Exception):
    """A backend that cannot be chosen: unknown, registered twice, or missing its extra."""


class Register(Protocol):
    def __call__(
        self,
        name: str,
        factory: Callable[..., Any],
        *,
        aliases: Iterable[str] = (),
        requires: Iterable[str] = (),
        extra: str | None = None,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class Backend:
    kind: str
    name: str
    factory: Callable[..., Any]
    plugin: str
    aliases: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    extra: str | None = None

    def missing_modules(self) -> list[str]:
        return [m for m in self.requires if importlib.util.find_spec(m) is None]


@dataclass
class BackendRegistry:
    """All backends of one kind (``llm``, ``memory``, ``embedding``)."""

    kind: str
    backends: dict[str, Backend] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)

    def register_for(self, plugin: str) -> Register:
        def register(
            name: str,
            factory: Callable[..., Any],
            *,
            aliases: Iterable[str] = (),
            requires: Iterable[str] = (),
            extra: str | None = None,
        ) -> None:
            backend = Backend(
                self.kind, name, factory, plugin, tuple(aliases), tuple(requires), extra
            )
            for key in (name, *backend.aliases):
                owner = self._owner(key)
                if owner is not None:
                    raise BackendError(
                        f"{self.kind} backend {key!r} is registered by both "
                        f"{owner.plugin} and {plugin}; disable one with AGENTIK_DISABLE_PLUGINS"
                    )
            self.backends[name] = backend
            for alias in backend.aliases:
                self.aliases[alias] = name

        return register

    def _owner(self, key: str) -> Backend | None:
        if key in self.backends:
            return self.backends[key]
        if key in self.aliases:
            return self.backends[self.aliases[key]]
        return None

    def get(self, name: str, *, variable: str) -> Backend:
        backend = self._owner(name.strip().lower())
        if backend is None:
            available = ", ".join(sorted(self.backends)) or "none installed"
            raise BackendError(
                f"{variable}={name!r}: unknown {self.kind} backend; available: {available}"
            )
        missing = backend.missing_modules()
        if missing:
            hint = f"pip install 'agentik[{backend.extra}]'" if backend.extra else "install it"
            raise BackendError(
                f"{variable}={name!r}: the {self.kind} backend needs {', '.join(missing)}; {hint}"
            )
        return backend
