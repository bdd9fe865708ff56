"""Backends registered by name, then chosen by an ``AGENTIK_*`` variable.

Selection never depends on plugin order: a name registered twice is an error naming both
plugins when it is the name selected (only a warning otherwise: two plugins offering the same
name do not stop an agent that uses neither), and an unknown name is an error listing what is
available (or naming the switch that left its plugin out). A factory may build another
registered backend by name and wrap it (:meth:`BackendRegistry.create`, given to factories
that take a ``backends`` parameter).
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentik.core.embedding import EmbeddingBackend
from agentik.core.errors import BackendError, PluginError, StartupError
from agentik.core.llm import LLMBackend
from agentik.core.memory import MemoryBackend

#: what a backend of each kind must be an instance of
CONTRACTS: dict[str, type] = {
    "llm": LLMBackend,
    "memory": MemoryBackend,
    "embedding": EmbeddingBackend,
}


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
    dist: str | None = None  # the plugin's distribution, for the install hint

    def missing_modules(self) -> list[str]:
        return [m for m in self.requires if importlib.util.find_spec(m) is None]

    def install_hint(self) -> str:
        from agentik import DISTRIBUTION

        if self.extra and self.dist:
            return f"pip install '{self.dist}[{self.extra}]'"
        if self.dist and self.dist != DISTRIBUTION:
            return f"pip install --upgrade '{self.dist}'"
        return f"install {', '.join(self.missing_modules()) or 'it'}"


@dataclass
class BackendRegistry:
    """All backends of one kind (``llm``, ``memory``, ``embedding``)."""

    kind: str
    backends: dict[str, Backend] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    #: says why an unknown name is unknown (the plugin providing it is disabled), or None
    explain_unknown: Callable[[str], str | None] | None = None
    #: names (or aliases) more than one plugin registered -> those plugins, first one first;
    #: the first keeps the name, and selecting it is an error naming them all
    conflicts: dict[str, list[str]] = field(default_factory=dict)
    _creating: list[str] = field(default_factory=list)

    def register_for(self, plugin: str, dist: str | None = None) -> Register:
        def register(
            name: str,
            factory: Callable[..., Any],
            *,
            aliases: Iterable[str] = (),
            requires: Iterable[str] = (),
            extra: str | None = None,
        ) -> None:
            if not callable(factory):
                raise TypeError(
                    f"register({name!r}, factory): the factory must be callable, "
                    f"not {type(factory).__name__}"
                )
            backend = Backend(
                self.kind,
                name.lower(),
                factory,
                plugin,
                tuple(a.lower() for a in aliases),
                tuple(requires),
                extra,
                dist,
            )
            taken = []
            for key in (backend.name, *backend.aliases):
                owner = self._owner(key)
                if owner is not None:
                    self.conflicts.setdefault(key, [owner.plugin]).append(plugin)
                    taken.append(key)
            if backend.name not in taken:
                self.backends[backend.name] = backend
            for alias in backend.aliases:
                if alias not in taken and backend.name not in taken:
                    self.aliases[alias] = backend.name

        return register

    def conflict(self, key: str) -> str | None:
        """The line saying who registered ``key`` more than once, or None."""
        plugins = self.conflicts.get(key)
        if not plugins:
            return None
        names = sorted(set(plugins))
        if len(names) == 1:
            return f"{self.kind} backend {key!r} is registered twice by {names[0]}"
        return (
            f"{self.kind} backend {key!r} is registered by both {', '.join(names[:-1])} and "
            f"{names[-1]}; disable one with AGENTIK_DISABLE_PLUGINS"
        )

    def conflict_lines(self) -> list[str]:
        return [line for key in self.conflicts if (line := self.conflict(key))]

    def _owner(self, key: str) -> Backend | None:
        if key in self.backends:
            return self.backends[key]
        if key in self.aliases:
            return self.backends[self.aliases[key]]
        return None

    def get(self, name: str, *, variable: str) -> Backend:
        """The backend called ``name`` (or one of its aliases), checked to be installable."""
        key = name.strip().lower()
        clash = self.conflict(key)
        if clash is not None:
            raise BackendError(f"{variable}={name!r}: {clash}")
        backend = self._owner(key)
        if backend is None:
            why = self.explain_unknown(name.strip().lower()) if self.explain_unknown else None
            if why:
                raise BackendError(f"{variable}={name!r}: {why}")
            available = ", ".join(sorted(self.backends)) or "none installed"
            raise BackendError(
                f"{variable}={name!r}: unknown {self.kind} backend; available: {available}"
            )
        missing = backend.missing_modules()
        if missing:
            raise BackendError(
                f"{variable}={name!r}: the {self.kind} backend of plugin {backend.plugin} needs "
                f"{', '.join(missing)}; {backend.install_hint()}"
            )
        return backend

    def create(
        self,
        name: str,
        settings: Any,
        *,
        variable: str | None = None,
        provide: Mapping[str, Callable[[], Any]] | None = None,
    ) -> Any:
        """Build the backend called ``name`` with its factory: what start-up does with the
        selected one, and what a backend that wraps another does with the inner one::

            def make_cached(settings, backends):
                return CachingLLM(backends.create(settings["CACHE_INNER"], settings))

        ``provide`` maps more parameter names to what makes their value: a factory that names
        one gets it (made only then), e.g. a memory factory's ``embedding``. A factory that
        raises is reported naming its plugin.
        """
        from agentik.core.settings import SettingsError

        backend = self.get(name, variable=variable or f"{self.kind} backend")
        if backend.name in self._creating:
            chain = " -> ".join([*self._creating, backend.name])
            raise BackendError(f"{self.kind} backends wrap each other in a loop: {chain}")
        self._creating.append(backend.name)
        try:
            wanted = inspect.signature(backend.factory).parameters
            kwargs = {k: make() for k, make in (provide or {}).items() if k in wanted}
            if "backends" in wanted:
                kwargs["backends"] = self
            made = backend.factory(settings, **kwargs)
        except (BackendError, SettingsError, PluginError, StartupError):
            raise
        except Exception as e:
            raise PluginError(
                backend.plugin, f"creating the {self.kind} backend {backend.name!r}", e
            ) from e
        finally:
            self._creating.pop()
        contract = CONTRACTS.get(self.kind)
        if contract is not None and not isinstance(made, contract):
            wrong = TypeError(
                f"the factory returned {type(made).__name__}, not {contract.__name__}"
            )
            raise PluginError(
                backend.plugin, f"creating the {self.kind} backend {backend.name!r}", wrong
            )
        return made


__all__ = ["Backend", "BackendError", "BackendRegistry", "Register"]
