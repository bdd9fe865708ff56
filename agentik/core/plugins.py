"""The plugin manager: entry points of the ``agentik`` group, loaded lazily and one by one.

Built-in plugins are entry points too, so they take exactly the path third-party plugins take.
A plugin that fails to import or implements an unknown hook is reported and skipped (unless
``AGENTIK_STRICT_PLUGINS=1``); it only stops start-up if something selects it.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pluggy
from pluggy import HookImpl, Result

from agentik import hookspecs
from agentik.core import builtin
from agentik.core.settings import Settings

log = logging.getLogger(__name__)

CORE_PLUGIN = "agentik.core"


@dataclass
class PluginInfo:
    name: str
    status: str  # ok | failed | blocked | skipped
    dist: str | None = None
    version: str | None = None
    error: str | None = None
    hooks: list[str] = field(default_factory=list)


class Plugins:
    """A pluggy manager plus what became of every plugin it was offered."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}
        self.add(builtin, CORE_PLUGIN)

    @property
    def hook(self) -> Any:
        return self.pm.hook

    def add(
        self,
        plugin: Any,
        name: str,
        *,
        dist: str | None = None,
        version: str | None = None,
        strict: bool = True,
    ) -> bool:
        """Register one plugin object and validate its hooks; False if it was rejected."""
        try:
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
        except Exception as e:
            if self.pm.get_plugin(name) is not None:
                self.pm.unregister(name=name)
            self.infos[name] = PluginInfo(name, "failed", dist, version, f"{type(e).__name__}: {e}")
            if strict:
                raise
            log.warning("plugin %s failed to load and is skipped: %s", name, e)
            return False
        hooks = sorted(c.name for c in self.pm.get_hookcallers(plugin) or ())
        self.infos[name] = PluginInfo(name, "ok", dist, version, None, hooks)
        return True

    def trace(self) -> None:
        """Log every hook call with its implementations, arguments and outcome (datasette's
        DATASETTE_TRACE_PLUGINS)."""
        trace = logging.getLogger("agentik.plugins.trace")

        def before(hook_name: str, impls: Sequence[HookImpl], kwargs: Mapping[str, Any]) -> None:
            names = ", ".join(impl.plugin_name for impl in impls)
            trace.info("%s(%s) -> [%s]", hook_name, ", ".join(kwargs), names)

        def after(
            outcome: Result[Any],
            hook_name: str,
            impls: Sequence[HookImpl],
            kwargs: Mapping[str, Any],
        ) -> None:
            if outcome.exception is not None:
                trace.info("%s raised %r", hook_name, outcome.exception)
            else:
                trace.info("%s returned %r", hook_name, outcome.get_result())

        self.pm.add_hookcall_monitoring(before, after)

    def remove(self, name: str) -> None:
        self.pm.unregister(name=name)
        self.infos.pop(name, None)

    def load_entrypoints(
        self, *, allow: Iterable[str] | None = None, block: Iterable[str] = (), strict: bool = False
    ) -> None:
        allowed = None if allow is None else set(allow)
        blocked = set(block)
        seen: set[str] = set()
        for ep in importlib.metadata.entry_points(group=hookspecs.PROJECT):
            if ep.name in seen or ep.name in self.infos:
                continue  # the same distribution twice on sys.path
            seen.add(ep.name)
            dist = ep.dist.name if ep.dist else None
            version = ep.dist.version if ep.dist else None
            if (
                ep.name in blocked
                or (dist and dist in blocked)
                or (allowed is not None and ep.name not in allowed and dist not in allowed)
            ):
                status = "blocked" if ep.name in blocked or dist in blocked else "skipped"
                self.infos[ep.name] = PluginInfo(ep.name, status, dist, version)
                self.pm.set_blocked(ep.name)
                continue
            try:
                plugin = ep.load()
            except Exception as e:
                if strict:
                    raise
                log.warning("plugin %s failed to import and is skipped: %s", ep.name, e)
                self.infos[ep.name] = PluginInfo(
                    ep.name, "failed", dist, version, f"{type(e).__name__}: {e}"
                )
                continue
            self.add(plugin, ep.name, dist=dist, version=version, strict=strict)


def make_plugins(
    *,
    load_entrypoints: bool = True,
    extra: Iterable[tuple[str, Any]] = (),
    env: Mapping[str, str] | None = None,
) -> Plugins:
    """Build a fresh manager: the core, the ``agentik`` entry points, then ``extra`` plugins.

    ``AGENTIK_LOAD_PLUGINS`` / ``AGENTIK_DISABLE_PLUGINS`` (comma lists of entry points or
    distributions; ``none`` loads no entry point) and ``AGENTIK_STRICT_PLUGINS`` are parsed
    here, with the core's declared parsers, because they decide which settings exist at all.
    """
    plugins = Plugins()
    if load_entrypoints:
        switches = Settings(builtin.PLUGIN_SWITCHES, os.environ if env is None else env)
        allow = switches["AGENTIK_LOAD_PLUGINS"]
        plugins.load_entrypoints(
            allow=None if allow is None else [p for p in allow if p != "none"],
            block=switches["AGENTIK_DISABLE_PLUGINS"],
            strict=switches["AGENTIK_STRICT_PLUGINS"],
        )
        if switches["AGENTIK_TRACE_PLUGINS"]:
            plugins.trace()
    for name, plugin in extra:
        plugins.add(plugin, name)
    return plugins
