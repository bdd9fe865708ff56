"""``agentik serve`` and ``agentik plugins``. Kept import-light so ``agentik --help`` is fast."""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web

    from agentik.core.plugins import Plugins
    from agentik.core.settings import Settings
    from agentik.core.store import TokenStats

log = logging.getLogger("agentik")
DETAILS_TIMEOUT = 60.0


def main(argv: Sequence[str] | None = None) -> int:
    from agentik import __version__

    parser = argparse.ArgumentParser(
        prog="agentik", description="Self-hosted runtime for one stateful chat agent."
    )
    parser.add_argument("--version", action="version", version=f"agentik {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser("serve", help="start the server (configured by AGENTIK_* variables)")
    serve.add_argument("--host", help="override AGENTIK_HOST")
    serve.add_argument("--port", type=_port, help="override AGENTIK_PORT")
    plugins = sub.add_parser("plugins", help="list plugins, their settings and what is active")
    plugins.add_argument("--json", action="store_true", help="print JSON")
    plugins.add_argument(
        "--settings-table",
        action="store_true",
        help="print every declared setting as a Markdown table (for docs)",
    )
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve_command(args.host, args.port)
    if args.command == "plugins":
        if args.settings_table:
            print(settings_table())
            return 0
        return plugins_command(args.json)
    parser.print_help()
    return 0


def _port(raw: str) -> int:
    from agentik.core.settings import parse_port

    try:
        return parse_port(raw)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{raw!r} {e}") from None


def fail(message: str) -> int:
    print(f"agentik: error: {message}", file=sys.stderr)
    return 2


def _bootstrap() -> tuple[Plugins, Settings]:
    from agentik.core.app import load_settings
    from agentik.core.plugins import make_plugins

    plugins = make_plugins()
    return plugins, load_settings(plugins)


def serve_command(host: str | None, port: int | None) -> int:
    from agentik.core.app import StartupError, create_app
    from agentik.core.settings import SettingsError

    try:
        plugins, settings = _bootstrap()
    except SettingsError as e:
        return fail(str(e))
    logging.basicConfig(
        level=settings["AGENTIK_LOG_LEVEL"].upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for info in plugins.infos.values():
        if info.status == "failed":
            log.warning("plugin %s failed to load: %s", info.name, info.error)
    try:
        app = create_app(settings, plugins)
    except (StartupError, SettingsError) as e:
        return fail(str(e))
    try:
        asyncio.run(
            _serve(
                app,
                host or settings["AGENTIK_HOST"],
                settings["AGENTIK_PORT"] if port is None else port,
                settings["AGENTIK_SHUTDOWN_TIMEOUT"],
            )
        )
    except StartupError as e:
        return fail(str(e))
    except OSError as e:
        return fail(f"cannot listen: {e}")
    return 0


async def _serve(app: web.Application, host: str, port: int, shutdown_timeout: float) -> None:
    from aiohttp import web

    from agentik.core.app import StartupError

    # handler_cancellation: an SSE handler whose client left ends at once, not at the next ping
    runner = web.AppRunner(
        app,
        shutdown_timeout=shutdown_timeout,
        handle_signals=False,
        access_log=None,
        handler_cancellation=True,
    )
    try:
        await runner.setup()
    except Exception as e:
        await runner.cleanup()
        raise e if isinstance(e, StartupError) else StartupError(f"start-up failed: {e}") from e
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():  # a second Ctrl-C: the operator does not want to wait
            log.warning("forced exit")
            os._exit(130)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        for line in await banner(app, host, bound):
            print(line, flush=True)
        await stop.wait()
        log.info("shutting down")
    finally:
        await runner.cleanup()
    log.info("stopped")


async def banner(app: web.Application, host: str, port: int) -> list[str]:
    from agentik.core.app import AGENT, PLUGINS, SETTINGS

    agent, plugins, settings = app[AGENT], app[PLUGINS], app[SETTINGS]
    shown = "localhost" if host in ("0.0.0.0", "::", "") else host
    endpoints = [f"agentik listening on http://{shown}:{port}", "  GET  /health"]
    lines: list[str] = []
    for result in plugins.hook.banner_lines(agent=agent, settings=settings):
        for line in result or ():
            (endpoints if line.startswith(" ") else lines).append(line)
    stats = await agent.store.token_stats()
    convs = await agent.store.count_conversations()
    return [
        *endpoints,
        f"  storage: {settings['AGENTIK_DB_PATH']}",
        *(f"  {line}" for line in lines),
        f"  tools: {len(agent.tools)}"
        + (f" ({', '.join(agent.tools.names())})" if agent.tools else ""),
        f"  tokens: {convs} convs, {stats.turns} turns, {token_counts(stats)}",
    ]


def token_counts(stats: TokenStats) -> str:
    """``in=…, out=…, total=…``: ``?`` when no turn was counted, never an unknown as 0."""
    if stats.turns and stats.uncounted == stats.turns:
        return "in=?, out=?, total=? (the model server gave no counts)"
    counts = f"in={stats.input}, out={stats.output}, total={stats.input + stats.output}"
    if stats.uncounted:
        counts += f" (+ {stats.uncounted} of {stats.turns} turns not counted)"
    return counts


def plugins_command(as_json: bool) -> int:
    from agentik.core.app import declared_settings, registries
    from agentik.core.plugins import make_plugins
    from agentik.core.registry import BackendError
    from agentik.core.settings import Settings, SettingsError

    plugins = make_plugins()
    try:
        regs = registries(plugins)
    except BackendError as e:
        return fail(str(e))
    declared = declared_settings(plugins)
    try:
        settings: dict[str, Any] = dict(Settings(declared))
        invalid = None
    except SettingsError as e:
        settings, invalid = {}, str(e)
    selected = {"llm": settings.get("AGENTIK_LLM_BACKEND")}
    details = {} if invalid else asyncio.run(plugin_details(plugins, Settings(declared)))
    report: list[dict[str, Any]] = []
    for info in plugins.infos.values():
        backends = [
            {
                "kind": b.kind,
                "name": b.name,
                "aliases": list(b.aliases),
                "available": not b.missing_modules(),
                "selected": selected.get(b.kind) in (b.name, *b.aliases),
            }
            for reg in regs.values()
            for b in reg.backends.values()
            if b.plugin == info.name
        ]
        report.append(
            {
                "name": info.name,
                "dist": info.dist,
                "version": info.version,
                "status": info.status,
                "error": info.error,
                "hooks": info.hooks,
                "backends": backends,
                "settings": [
                    {
                        "name": s.name,
                        "default": _show(s.default),
                        "value": "***"
                        if s.secret and settings.get(s.name)
                        else _show(settings.get(s.name)),
                        "help": s.help,
                    }
                    for s in declared
                    if s.plugin == info.name
                ],
                "details": details.get(info.name),
            }
        )
    if as_json:
        print(json.dumps({"plugins": report, "invalidSettings": invalid}, indent=2))
        return 0
    for p in report:
        version = f" {p['version']}" if p["version"] else ""
        print(f"{p['name']}{version} [{p['status']}]" + (f": {p['error']}" if p["error"] else ""))
        if p["hooks"]:
            print(f"  hooks: {', '.join(p['hooks'])}")
        for b in p["backends"]:
            state = (
                "selected"
                if b["selected"]
                else ("available" if b["available"] else "missing its extra")
            )
            aliases = f" (aliases: {', '.join(b['aliases'])})" if b["aliases"] else ""
            print(f"  {b['kind']} backend: {b['name']}{aliases} — {state}")
        for s in p["settings"]:
            print(
                f"  {s['name']}={s['value'] if s['value'] is not None else ''}"
                f"  (default: {s['default'] or '—'}) {s['help']}"
            )
        for key, value in (p["details"] or {}).items():
            shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            print(f"  {key}: {shown}")
    if invalid:
        print(f"invalid settings: {invalid}")
    return 0


async def plugin_details(plugins: Plugins, settings: Settings) -> dict[str, Any]:
    """Each plugin's ``plugin_details``, by plugin name; a failure is reported, not raised."""
    out: dict[str, Any] = {}
    for impl in plugins.hook.plugin_details.get_hookimpls():
        try:
            result = impl.function(*[{"settings": settings}[a] for a in impl.argnames])
            if inspect.isawaitable(result):
                result = await asyncio.wait_for(result, DETAILS_TIMEOUT)
        except Exception as e:
            result = {"error": f"{type(e).__name__}: {e}"}
        if result is not None:
            out[impl.plugin_name] = result
    return out


def _show(value: Any) -> str | None:
    """A setting's value as it would be written in the environment (None: unset)."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, tuple):
        return ",".join(value) or None
    return None if value is None else str(value)


def settings_table() -> str:
    """The README's configuration table, generated from what the plugins declare."""
    from agentik.core.app import declared_settings
    from agentik.core.plugins import make_plugins

    rows = ["| Variable | Default | Plugin | Meaning |", "|---|---|---|---|"]
    for s in declared_settings(make_plugins(env={})):
        shown = _show(s.default)
        default = "—" if shown is None else f"`{shown}`"
        rows.append(f"| `{s.name}` | {default} | {s.plugin} | {s.help} |")
    return "\n".join(rows)
