"""The plugin manager: entry points of the ``agentik`` group, loaded lazily and one by one.

Built-in plugins are entry points too, so they take exactly the path third-party plugins take.
A plugin that fails to import, implements an unknown hook or writes an ``async def`` hook is
reported and skipped (unless ``AGENTIK_STRICT_PLUGINS=1``); it only stops start-up if something
selects it.

Hooks whose implementations must not affect one another (the ``register_*`` hooks at start-up,
``before_turn`` / ``after_turn`` / ``before_compaction`` in a turn) are called one
implementation at a time (:func:`call_each`, :func:`call_startup`), so a failure names its
plugin and the other plugins' contributions stay.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import importlib.util
import inspect
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy
from pluggy import HookCaller, HookImpl, Result

from agentik import hookspecs
from agentik.core import builtin
from agentik.core.errors import BackendError, PluginError, StartupError
from agentik.core.failures import log_failure, one_line
from agentik.core.settings import Settings, SettingsError

log = logging.getLogger(__name__)

CORE_PLUGIN = "agentik.core"


def call_impl(caller: HookCaller, impl: HookImpl, kwargs: Mapping[str, Any]) -> Any:
    """Call one implementation of a hook with the arguments it asks for.

    It goes through the manager's executor (what ``caller(**kwargs)`` uses for all of them), so
    ``AGENTIK_TRACE_PLUGINS`` sees the call like any other.
    """
    results: Any = caller._hookexec(caller.name, [impl], dict(kwargs), False)
    return results[0] if results else None


def call_each(caller: HookCaller, where: str = "", **kwargs: Any) -> list[tuple[str, Any]]:
    """Call every implementation on its own, in registration order; return ``(plugin, result)``
    pairs. One that raises is logged with its plugin's name and the others go on."""
    out = []
    for impl in caller.get_hookimpls():
        try:
            out.append((impl.plugin_name, call_impl(caller, impl, kwargs)))
        except Exception as e:
            log_failure(f"{caller.name} of plugin {impl.plugin_name}{where}", e)
    return out


def call_startup(
    caller: HookCaller, register_for: Callable[[str], Any] | None = None, **kwargs: Any
) -> None:
    """Call every implementation in registration order at start-up; the first that raises stops
    start-up with a :class:`PluginError` naming its plugin and the hook. Errors that already
    say what is wrong (an invalid setting, a backend conflict) go through as they are.

    ``register_for(plugin)``: the ``register`` callable each implementation gets, made for its
    plugin (so what it registers knows where it came from)."""
    from agentik.core.settings import SettingsError

    for impl in caller.get_hookimpls():
        own = {} if register_for is None else {"register": register_for(impl.plugin_name)}
        try:
            call_impl(caller, impl, {**own, **kwargs})
        except (StartupError, BackendError, SettingsError):
            raise
        except Exception as e:
            raise PluginError(impl.plugin_name, caller.name, e) from e


def _async_hooks(pm: pluggy.PluginManager, plugin: Any) -> list[str]:
    return [
        caller.name
        for caller in pm.get_hookcallers(plugin) or ()
        for impl in caller.get_hookimpls()
        if impl.plugin is plugin
        and (
            inspect.iscoroutinefunction(impl.function) or inspect.isasyncgenfunction(impl.function)
        )
    ]


@dataclass
class PluginInfo:
    name: str
    status: str  # ok | failed | blocked | skipped
    dist: str | None = None
    version: str | None = None
    error: str | None = None
    hooks: list[str] = field(default_factory=list)
    #: why it is not loaded: the variable that left it out (``blocked`` / ``skipped``)
    reason: str | None = None
    entry_point: Any = field(default=None, repr=False, compare=False)


class Plugins:
    """A pluggy manager plus what became of every plugin it was offered."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}
        #: start-up warnings about the plugin switches (logged by ``serve``, shown by ``plugins``)
        self.warnings: list[str] = []
        self._reported = False
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
            if self.pm.get_plugin(name) is not None:  # pluggy would dump every plugin it has
                where = self.infos[name].dist if name in self.infos else None
                raise ValueError(
                    f"a plugin named {name!r} is loaded already"
                    + (f" (from {where})" if where else "")
                )
            if self.pm.is_registered(plugin):
                raise ValueError(
                    f"the same module is loaded already as {self.pm.get_name(plugin)!r}"
                )
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
            asynchronous = _async_hooks(self.pm, plugin)
            if asynchronous:
                raise TypeError(
                    f"hook {', '.join(asynchronous)} is `async def`, but agentik hooks are "
                    "synchronous (pluggy awaits nothing): make it a plain `def` that returns the "
                    "awaitable, or registers async objects (see docs/plugin_hooks.md)"
                )
        except Exception as e:
            if self.pm.get_plugin(name) is plugin:  # never the plugin that had the name first
                self.pm.unregister(name=name)
            if self.infos.get(name, PluginInfo(name, "")).status != "ok":
                self.infos[name] = PluginInfo(name, "failed", dist, version, one_line(e))
            if strict:
                raise PluginError(name, "loading", e) from e
            return False
        hooks = sorted(c.name for c in self.pm.get_hookcallers(plugin) or ())
        self.infos[name] = PluginInfo(name, "ok", dist, version, None, hooks)
        return True

    def report(self) -> None:
        """Log, once, each plugin that failed to load and each warning about the switches."""
        if self._reported:
            return
        self._reported = True
        for key, info in self.infos.items():
            if info.status == "failed":
                log.warning("plugin %s failed to load and is skipped: %s", key, info.error)
        for warning in self.warnings:
            log.warning("%s", warning)

    def trace(self) -> None:
        """Log every hook call with its implementations, arguments and outcome (datasette's
        DATASETTE_TRACE_PLUGINS)."""
        trace = logging.getLogger("agentik.plugins.trace")

        def before(hook_name: str, impls: Sequence[HookImpl], kwargs: Mapping[str, Any]) -> None:
            names = ", ".join(impl.plugin_name for impl in impls)
            trace.info("%s(%s) -> [%s]", hook_name, ", ".join(kwargs), names)
            register = kwargs.get("register")
            if callable(register) and isinstance(kwargs, dict):
                # a register_* hook returns nothing: what it registers is what it does
                def traced(*args: Any, **kw: Any) -> Any:
                    shown = [_short(a) for a in args] + [f"{k}={_short(v)}" for k, v in kw.items()]
                    trace.info("%s of %s: register(%s)", hook_name, names, ", ".join(shown))
                    return register(*args, **kw)

                kwargs["register"] = traced

        def after(
            outcome: Result[Any],
            hook_name: str,
            impls: Sequence[HookImpl],
            kwargs: Mapping[str, Any],
        ) -> None:
            if outcome.exception is not None:
                trace.info("%s raised %r", hook_name, outcome.exception)
            elif "register" not in kwargs or any(r is not None for r in outcome.get_result()):
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
        known: set[str] = set()
        wanted: dict[str, list[Any]] = {}  # entry-point name -> its entry points, one per dist
        left_out: list[tuple[Any, str, str]] = []
        for ep in importlib.metadata.entry_points(group=hookspecs.PROJECT):
            if ep.name in self.infos:
                continue
            dist = _dist(ep)
            known.update(n for n in (ep.name, dist) if n)
            if ep.name in blocked or (dist and dist in blocked):
                left_out.append((ep, "blocked", "AGENTIK_DISABLE_PLUGINS"))
            elif allowed is not None and ep.name not in allowed and dist not in allowed:
                left_out.append((ep, "skipped", "AGENTIK_LOAD_PLUGINS"))
            elif all(_dist(other) != dist for other in wanted.get(ep.name, ())):
                wanted.setdefault(ep.name, []).append(ep)  # (one dist twice on sys.path: once)
        for name, eps in wanted.items():
            ep = self._one_of(name, eps, strict)
            try:
                plugin = ep.load()
            except Exception as e:
                if strict:
                    raise PluginError(ep.name, "import", e) from e
                self.infos[ep.name] = PluginInfo(
                    ep.name, "failed", _dist(ep), _version(ep), one_line(e)
                )
                continue
            self.add(plugin, ep.name, dist=_dist(ep), version=_version(ep), strict=strict)
        for ep, status, variable in left_out:
            if ep.name not in self.infos:  # another distribution's plugin of that name loaded
                self._leave_out(ep, status, variable, _dist(ep), _version(ep))
        for variable, names in (
            ("AGENTIK_LOAD_PLUGINS", allowed or ()),
            ("AGENTIK_DISABLE_PLUGINS", blocked),
        ):
            for name in sorted(set(names) - known):
                self.warnings.append(
                    f"{variable}: no installed plugin is called {name!r}{closest(name, known)}"
                )

    def _one_of(self, name: str, eps: list[Any], strict: bool) -> Any:
        """The entry point to load when several distributions define one called ``name``
        (pluggy names plugins by it, so only one can load): agentik's own, else the first on
        ``sys.path``. The others are reported, never dropped silently; strict mode stops."""
        from agentik import DISTRIBUTION

        if len(eps) == 1:
            return eps[0]
        chosen = next((ep for ep in eps if _dist(ep) == DISTRIBUTION), eps[0])
        for ep in eps:
            if ep is chosen:
                continue
            problem = (
                f"{_dist(chosen)} defines an `agentik` entry point of the same name, which is "
                "loaded instead (an entry point's name must be unique: name it after its module)"
            )
            if strict:
                raise StartupError(f"plugin {name} of {_dist(ep)}: {problem}")
            key = f"{name} ({_dist(ep)})"
            self.infos[key] = PluginInfo(key, "failed", _dist(ep), _version(ep), problem)
        return chosen

    def load_dir(self, folder: Path, *, block: Iterable[str] = (), strict: bool = False) -> None:
        """Every ``*.py`` of ``folder`` as a plugin named after its file (datasette's
        ``--plugins-dir``): for a plugin too small to package. A file named like an installed
        plugin replaces it (with a warning): the file is what its author is working on."""
        if not folder.is_dir():
            raise SettingsError(f"AGENTIK_PLUGINS_DIR={str(folder)!r} is not a folder")
        blocked = set(block)
        for path in sorted(folder.glob("*.py")):
            name = path.stem
            if name in blocked:
                self.infos[name] = PluginInfo(
                    name, "blocked", str(path), reason="AGENTIK_DISABLE_PLUGINS"
                )
                continue
            module_name = f"agentik_plugins_dir.{name}"
            try:
                spec = importlib.util.spec_from_file_location(module_name, path)
                assert spec is not None and spec.loader is not None
                module = importlib.util.module_from_spec(spec)
                sys.modules[module_name] = module
                spec.loader.exec_module(module)
            except Exception as e:
                sys.modules.pop(module_name, None)
                if strict:
                    raise PluginError(name, "import", e) from e
                self.infos[name] = PluginInfo(name, "failed", str(path), None, one_line(e))
                continue
            self._make_room(name, path)
            self.add(module, name, dist=str(path), strict=strict)

    def _make_room(self, name: str, path: Path) -> None:
        """Take out an installed plugin called ``name`` for the file of the same name."""
        installed = self.infos.get(name)
        if installed is None:
            return
        if self.pm.get_plugin(name) is not None:
            self.pm.unregister(name=name)
        if self.pm.is_blocked(name):  # left out by a switch: the file is loaded whatever
            self.pm.unblock(name)
        if installed.status == "ok":
            self.warnings.append(
                f"plugin {name}: {path} replaces the installed plugin of that name "
                f"({installed.dist} {installed.version or ''}".rstrip()
                + "); rename the file to load both"
            )
        del self.infos[name]

    def _leave_out(
        self, ep: Any, status: str, variable: str, dist: str | None, version: str | None
    ) -> None:
        self.infos[ep.name] = PluginInfo(
            ep.name, status, dist, version, reason=variable, entry_point=ep
        )
        self.pm.set_blocked(ep.name)

    def provider_left_out(self, hook: str, name: str) -> PluginInfo | None:
        """The plugin left out by a switch that would register ``name`` through ``hook``.

        Only asked when a name is unknown (the error path): the left-out plugins are imported
        to look, never registered.
        """
        for info in self.infos.values():
            if info.entry_point is None:
                continue
            found: list[str] = []

            def register(
                backend: str,
                *args: Any,
                aliases: Iterable[str] = (),
                found: list[str] = found,
                **kw: Any,
            ) -> None:
                found.extend([backend.lower(), *(a.lower() for a in aliases)])

            try:
                impl = getattr(info.entry_point.load(), hook, None)
                if impl is not None:
                    impl(register=register)
            except Exception:
                continue
            if name in found:
                return info
        return None


def _dist(ep: Any) -> str | None:
    return ep.dist.name if ep.dist else None


def _version(ep: Any) -> str | None:
    return ep.dist.version if ep.dist else None


def _short(value: Any) -> str:
    """What a plugin registered, in a few words: ``Tool('roll')``, ``'name'``, ``make_backend``."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 60 else repr(value[:57] + "...")
    name = getattr(value, "name", None) or getattr(value, "prefix", None)
    if isinstance(name, str):
        return f"{type(value).__name__}({name!r})"
    if callable(value):
        return str(getattr(value, "__qualname__", type(value).__name__))
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def closest(name: str, candidates: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest candidate, or ``""``."""
    match = difflib.get_close_matches(name, list(candidates), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def make_plugins(
    *,
    load_entrypoints: bool = True,
    extra: Iterable[tuple[str, Any]] = (),
    env: Mapping[str, str] | None = None,
) -> Plugins:
    """Build a fresh manager: the core, the ``agentik`` entry points, then ``extra`` plugins.

    ``AGENTIK_LOAD_PLUGINS`` / ``AGENTIK_DISABLE_PLUGINS`` (comma lists of entry points or
    distributions; ``none`` loads no entry point), ``AGENTIK_PLUGINS_DIR`` (single-file
    plugins, loaded whatever ``AGENTIK_LOAD_PLUGINS`` says) and ``AGENTIK_STRICT_PLUGINS`` are
    parsed here, with the core's declared parsers, because they decide which settings exist.
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
        if switches["AGENTIK_PLUGINS_DIR"] is not None:
            plugins.load_dir(
                switches["AGENTIK_PLUGINS_DIR"],
                block=switches["AGENTIK_DISABLE_PLUGINS"],
                strict=switches["AGENTIK_STRICT_PLUGINS"],
            )
        if switches["AGENTIK_TRACE_PLUGINS"]:
            plugins.trace()
    for name, plugin in extra:
        plugins.add(plugin, name)
    return plugins


__all__ = ["BackendError", "PluginError", "Plugins", "StartupError", "make_plugins"]
