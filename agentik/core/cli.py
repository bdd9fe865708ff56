"""``agentik serve``, ``agentik plugins`` and the plugins' commands. Kept import-light so
``agentik --help`` is fast."""

from __future__ import annotations

import argparse
import asyncio
import errno
import inspect
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentik.core.errors import fail

if TYPE_CHECKING:
    from aiohttp import web

    from agentik.core.plugins import Plugins
    from agentik.core.settings import Settings
    from agentik.core.store import FeatureUsage, TokenStats

log = logging.getLogger("agentik")
DETAILS_TIMEOUT = 60.0


def main(argv: Sequence[str] | None = None, plugins: Plugins | None = None) -> int:
    """The command line; ``plugins`` (tests): the plugins whose commands it offers, instead of
    the installed ones."""
    from agentik import __version__

    parser = argparse.ArgumentParser(
        prog="agentik",
        description="Self-hosted runtime for one stateful chat agent.",
        epilog="Plugins add commands too (listed above); `agentik COMMAND --help` describes one.",
    )
    parser.add_argument("--version", action="version", version=f"agentik {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser("serve", help="start the server (configured by AGENTIK_* variables)")
    serve.add_argument("--host", help="override AGENTIK_HOST")
    serve.add_argument("--port", type=_port, help="override AGENTIK_PORT")
    serve.add_argument(
        "--reload",
        action="store_true",
        help="restart when a plugin's source changes (AGENTIK_PLUGINS_DIR, installed plugins)",
    )
    listing = sub.add_parser("plugins", help="list plugins, their settings and what is active")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.add_argument(
        "--settings-table",
        action="store_true",
        help="print every declared setting as a Markdown table (for docs)",
    )
    listing_sub = listing.add_subparsers(dest="plugins_command", metavar="new")
    new = listing_sub.add_parser(
        "new", help="write a new plugin distribution (pyproject, module, test, CI) to start from"
    )
    new.add_argument("name", help="the plugin's name, e.g. heartbeat (-> agentik-heartbeat)")
    new.add_argument("--dir", default=".", help="where to write it (default: %(default)s)")
    chat = sub.add_parser("chat", help="chat with a running agentik in this terminal")
    chat.add_argument("--conversation", metavar="ID", help="continue this conversation")
    chat.add_argument("--new", action="store_true", help="start a new conversation")
    export = sub.add_parser(
        "export", help="print a whole conversation of a running agentik (Markdown or JSON)"
    )
    export.add_argument("conversation", help="its id (or the start of it), title, or /list number")
    export.add_argument("--format", choices=("md", "json"), default="md", help="default: md")
    for client in (chat, export):
        client.add_argument(
            "--url",
            help="the server (default: the one `agentik serve` starts: AGENTIK_HOST, "
            "AGENTIK_PORT, else http://127.0.0.1:8080)",
        )
        client.add_argument("--key", help="the API key (default: AGENTIK_API_KEY)")
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    plugin_commands: dict[str, Any] = {}
    # the plugins (and aiohttp) load only for a plugin's command or the top-level help, so
    # `agentik serve` stays fast
    wants_help = command is None and (not argv or "-h" in argv or "--help" in argv)
    if wants_help or (command is not None and command not in sub.choices):
        try:
            if plugins is None:
                from agentik.core.plugins import make_plugins

                plugins = make_plugins()
            plugin_commands = add_plugin_commands(sub, plugins)
        except Exception as e:
            if not wants_help:  # the help shows the core's commands all the same
                return fail(str(e), e)
    args = parser.parse_args(argv)
    if args.command in plugin_commands:
        assert plugins is not None
        return run_plugin_command(plugin_commands[args.command], args, plugins)
    if args.command == "chat":
        from agentik.chat import ChatError, chat_command

        try:
            chat_command(args.url, args.key, args.conversation, args.new)
        except ChatError as e:
            return fail(str(e))
        except KeyboardInterrupt:  # before the chat took Ctrl-C over
            return 130
        return 0
    if args.command == "export":
        from agentik.chat import ChatError, export_command

        try:
            export_command(args.url, args.key, args.conversation, args.format)
        except ChatError as e:
            return fail(str(e))
        return 0
    if args.command == "serve":
        if args.reload:
            from agentik.core.reload import serve_with_reload

            try:
                return serve_with_reload(args.host, args.port, os.environ)
            except Exception as e:  # an invalid AGENTIK_PLUGINS_DIR, …
                return fail(str(e), e)
        return serve_command(args.host, args.port)
    if args.command == "plugins":
        if args.plugins_command == "new":
            return new_plugin_command(args.name, args.dir)
        if args.settings_table:
            print(settings_table())
            return 0
        return plugins_command(args.json)
    parser.print_help()
    return 0


def new_plugin_command(name: str, folder: str) -> int:
    from pathlib import Path

    from agentik.core.template import new_plugin

    try:
        made = new_plugin(name, Path(folder))
    except (ValueError, OSError) as e:
        return fail(str(e))
    print(f"wrote {made}/: cd {made} && pip install -e '.[test]' && python -m pytest -q")
    return 0


def add_plugin_commands(sub: Any, plugins: Plugins) -> dict[str, Any]:
    """The plugins' ``register_commands``: each command gets its sub-parser; returns their
    ``run`` functions by name."""
    from agentik.core.plugins import PluginError, call_impl

    runs: dict[str, Any] = {}
    caller = plugins.hook.register_commands
    for impl in caller.get_hookimpls():

        def register(
            name: str, setup: Any, run: Any, help: str = "", plugin: str = impl.plugin_name
        ) -> None:
            if name in sub.choices:
                raise ValueError(f"the command {name!r} exists already")
            setup(sub.add_parser(name, help=help))
            runs[name] = run

        try:
            call_impl(caller, impl, {"register": register})
        except Exception as e:
            raise PluginError(impl.plugin_name, "register_commands", e) from e
    return runs


def run_plugin_command(run: Any, args: argparse.Namespace, plugins: Plugins) -> int:
    from agentik.core.app import load_settings
    from agentik.core.plugins import PluginError
    from agentik.core.settings import SettingsError

    try:
        settings = load_settings(plugins)
    except (SettingsError, PluginError) as e:
        return fail(str(e), e)
    logging.basicConfig(level=settings["AGENTIK_LOG_LEVEL"].upper(), format="%(message)s")
    try:
        return int(run(args, settings) or 0)
    except SettingsError as e:
        return fail(str(e), e)
    except KeyboardInterrupt:
        return fail("interrupted")


def _port(raw: str) -> int:
    from agentik.core.settings import parse_port

    try:
        return parse_port(raw)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{raw!r} {e}") from None


def _bootstrap() -> tuple[Plugins, Settings]:
    from agentik.core.app import load_settings
    from agentik.core.plugins import make_plugins

    plugins = make_plugins()
    return plugins, load_settings(plugins)


def serve_command(host: str | None, port: int | None) -> int:
    from agentik.core.app import StartupError, create_app
    from agentik.core.registry import BackendError
    from agentik.core.security import bind_host
    from agentik.core.settings import SettingsError, undeclared_variables

    try:
        plugins, settings = _bootstrap()
    except (SettingsError, StartupError) as e:
        return fail(str(e), e)
    from agentik.core.logs import configure

    configure(settings["AGENTIK_LOG_LEVEL"], settings["AGENTIK_LOG_FORMAT"])
    plugins.report()
    undeclared = undeclared_variables(
        settings.declared, prefixes=settings.prefixes, others=settings.others
    )
    for warning in undeclared:
        log.warning("%s", warning)
    try:
        host = bind_host(settings, host)
        app = create_app(settings, plugins)
    except (StartupError, SettingsError, BackendError, ValueError) as e:
        return fail(str(e), e)
    port = settings["AGENTIK_PORT"] if port is None else port
    try:
        asyncio.run(_serve(app, host, port, settings["AGENTIK_SHUTDOWN_TIMEOUT"]))
    except StartupError as e:
        return fail(str(e), e)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            return fail(
                f"cannot listen on {host}:{port}: the port is in use (another server?); "
                f"set AGENTIK_PORT (or --port) to a free one, e.g. AGENTIK_PORT={port + 1}"
            )
        return fail(f"cannot listen: {e}")
    return 0


async def _serve(app: web.Application, host: str, port: int, shutdown_timeout: float) -> None:
    import socket

    from aiohttp import web

    from agentik.core.app import LIMITS, SETTINGS, TROUBLE, StartupError
    from agentik.core.listener import (
        ACCEPT_BATCH,
        BACKLOG,
        Listener,
        connection_cap,
        quiet_accept_errors,
    )

    settings = app[SETTINGS]
    handler_args = {
        "access_log": None,
        # also from the connection's start: a client that sends nothing, or its headers too
        # slowly to finish a request, is closed after it (aiohttp's idle check)
        "keepalive_timeout": settings["AGENTIK_KEEPALIVE_TIMEOUT"],
    }
    runner = web.AppRunner(
        app,
        handle_signals=False,
        # an SSE handler whose client left ends at once, not at the next ping
        handler_cancellation=True,
        **handler_args,
    )
    try:
        await runner.setup()
    except Exception as e:
        await runner.cleanup()
        if isinstance(e, StartupError):  # a PluginError among them
            raise
        raise StartupError(f"start-up failed: {type(e).__name__}: {e}") from e
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    _stop_on_signals(loop, stop, shutdown_timeout)
    # an accept that fails for want of descriptors: counted, not a traceback each
    loop.set_exception_handler(quiet_accept_errors(app[TROUBLE]))
    listening: asyncio.Server | None = None
    assert runner.server is not None
    cap = connection_cap(settings["AGENTIK_MAX_CONNECTIONS"])
    # not a TCPSite: connections beyond the cap or their client's limits get a 503/429,
    # aiohttp's own errors JSON, clients that stop reading are dropped
    listener = Listener(
        runner.server,
        cap,
        app[TROUBLE],
        handler_args,
        app[LIMITS],
        settings["AGENTIK_WRITE_TIMEOUT"],
    )
    try:
        # asyncio accepts up to ``backlog`` connections a tick (and, out of descriptors, tries
        # each of them again): a modest batch, but a deep kernel queue for bursts
        listening = await loop.create_server(listener, host, port, backlog=ACCEPT_BATCH)
        for sock in listening.sockets:
            with socket.socket(fileno=os.dup(sock.fileno())) as same:
                same.listen(BACKLOG)
        bound = listening.sockets[0].getsockname()[:2] if listening.sockets else (host, port)
        for line in await banner(app, *bound):
            print(line, flush=True)
        await stop.wait()
        log.info("shutting down")
    finally:
        await _stop(app, runner.server, listening, listener, shutdown_timeout)
    log.info("stopped")


#: seconds of a stop kept for closing the agent, its services and the database
CLEANUP_SHARE = 2.0


def _stop_on_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event, budget: float) -> None:
    """SIGINT/SIGTERM stop the server; a second one exits at once with status 130, at any
    moment until the process is gone (plain ``signal`` handlers: asyncio's own are reset to
    the default, which kills with -15, when its loop closes); a stop still running
    ``budget`` seconds after the first signal exits with status 1."""
    import socket
    import threading

    # the C-level handler writes here from whatever thread caught the signal: the loop wakes
    # at once and the main thread runs the Python handler below
    wake = socket.socketpair()  # kept by the handler: closed, its number would be reused
    for end in wake:
        end.setblocking(False)
    signal.set_wakeup_fd(wake[1].fileno(), warn_on_full_buffer=False)
    caught: list[int] = []  # one byte each signal caught (Python runs one handler for two)

    def count() -> None:  # other signals with a Python handler write here too
        caught.extend(n for n in wake[0].recv(512) if n in (signal.SIGINT, signal.SIGTERM))
        if len(caught) > 1:
            forced_exit()

    loop.add_reader(wake[0].fileno(), count)
    stopping: list[bool] = []

    def on_signal(signum: int, frame: Any, wake: tuple[Any, ...] = wake) -> None:
        if stopping:  # a second Ctrl-C: the operator does not want to wait
            forced_exit()
        stopping.append(True)
        watchdog = threading.Timer(budget, _overrun, (budget,))
        watchdog.daemon = True
        watchdog.start()
        if not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)


def forced_exit() -> None:
    os.write(2, b"agentik: forced exit\n")
    os._exit(130)


def _overrun(budget: float) -> None:
    os.write(
        2, f"agentik: the stop took over AGENTIK_SHUTDOWN_TIMEOUT={budget:g} s: exiting\n".encode()
    )
    os._exit(1)


async def _stop(
    app: web.Application,
    server: Any,
    listening: asyncio.Server | None,
    listener: Any,
    budget: float,
) -> None:
    """Stop within ``budget`` seconds: no new connections; running turns record their ends
    (interrupted) and the stop is recorded as clean; event streams end; requests in progress
    get until the grace deadline, then every connection left is cut (an upload that trickles,
    a client that does not read); the rest of the budget closes the agent, its services and
    the database."""
    from agentik.core.app import READINESS

    loop = asyncio.get_running_loop()
    start = loop.time()
    grace_end = start + budget - min(CLEANUP_SHARE, budget / 2)
    app[READINESS].stopping = True
    if listening is not None:
        listening.close()  # no new connections
    transports = [c.transport for c in server.connections if c.transport is not None]
    server.pre_shutdown()  # idle keep-alive connections close now, busy ones after their answer
    try:
        async with asyncio.timeout_at(grace_end):
            await app.shutdown()  # turns record their ends, streams end (_end_streams)
            await server.shutdown(grace_end - loop.time())  # requests in progress finish
    except TimeoutError:
        log.warning("requests still running at the stop's deadline: cut")
    transports += [c.transport for c in server.connections if c.transport is not None]

    def flushing() -> bool:  # answers still on their way to clients that read them
        return any(t.get_write_buffer_size() for t in transports)

    while loop.time() < grace_end and flushing():  # noqa: ASYNC110 - nothing signals a drain
        await asyncio.sleep(0.05)
    for transport in transports:
        transport.abort()  # what is left: uploads, clients that do not read
    listener.close()
    await app.cleanup()  # the agent, its services, the LLM client, the database
    if loop.time() - start > budget:
        log.warning(
            "the stop took %.1f s (AGENTIK_SHUTDOWN_TIMEOUT=%g)", loop.time() - start, budget
        )


async def banner(app: web.Application, host: str, port: int) -> list[str]:
    from agentik.core.app import AGENT, PLUGINS, SETTINGS, llm_choice, storage_of
    from agentik.core.security import is_loopback

    agent, plugins, settings = app[AGENT], app[PLUGINS], app[SETTINGS]
    shown = f"[{host}]" if ":" in host else host
    where = "every interface" if host in ("0.0.0.0", "::") else None
    where = where or ("this machine only" if is_loopback(host) else "the network")
    keys = settings["AGENTIK_API_KEY"]
    access = (
        f"API key required ({len(keys)} key{'s' if len(keys) > 1 else ''})"
        if keys
        else ("no API key" if is_loopback(host) else "NO API KEY: anyone who reaches it can use it")
    )
    endpoints = [
        f"agentik listening on http://{shown}:{port} ({where}; {access})",
        "  GET  /health",
    ]
    if not keys and not is_loopback(host):
        log.warning("listening on %s without an API key (AGENTIK_ALLOW_UNAUTHENTICATED=1)", host)
    lines: list[str] = []
    for line in plugin_banner_lines(plugins, agent, settings):
        (endpoints if line.startswith(" ") else lines).append(line)
    endpoints += unannounced_routes(app, endpoints)
    stats = await agent.store.token_stats()
    background = await agent.store.background_usage()
    convs = await agent.store.count_conversations()
    name, why = llm_choice(settings)
    return [
        *endpoints,
        f"  storage: {storage_of(settings)}",
        f"  llm: {agent.llm.description or type(agent.llm).__name__}",
        *([f"  llm choice: {name} ({why})"] if why else []),
        *(f"  {line}" for line in lines),
        f"  tools: {len(agent.tools)}"
        + (f" ({', '.join(agent.tools.names())})" if agent.tools else ""),
        f"  tokens: {convs} convs, {stats.turns} turns, {token_counts(stats)}"
        + background_counts(background),
    ]


def plugin_banner_lines(plugins: Plugins, agent: Any, settings: Settings) -> list[str]:
    """Every plugin's ``banner_lines``; one that raises or returns anything but a list of
    strings is logged naming its plugin, its lines are skipped, and start-up goes on."""
    from agentik.core.plugins import call_each

    out: list[str] = []
    for plugin, result in call_each(plugins.hook.banner_lines, agent=agent, settings=settings):
        if result is None:
            continue
        if isinstance(result, list | tuple) and all(isinstance(x, str) for x in result):
            out += result
            continue
        if inspect.iscoroutine(result):
            result.close()  # never awaited: no "was never awaited" warning
        log.error(
            "banner_lines of plugin %s returned %s, not a list of strings; its lines are skipped",
            plugin,
            type(result).__name__,
        )
    return out


def unannounced_routes(app: web.Application, announced: list[str]) -> list[str]:
    """``  GET  /path`` for every route a plugin added without a banner line of its own; a
    sub-application whose prefix a banner line shows (the HTTP API) is left to that line."""
    from aiohttp import web

    shown = " ".join(announced)
    out: list[str] = []

    def walk(router: web.UrlDispatcher) -> None:
        for resource in router.resources():
            if isinstance(resource, web.PrefixedSubAppResource):
                if f"{resource.canonical}/" not in shown:  # its routes carry the prefix already
                    walk(resource.get_info()["app"].router)
                continue
            path = resource.canonical
            for route in resource:
                line = f"  {route.method:<4} {path}"
                if route.method != "HEAD" and path not in shown and line not in out:
                    out.append(line)

    walk(app.router)
    return out


def token_counts(stats: TokenStats) -> str:
    """``in=…, out=…, total=…``: ``?`` when no turn was counted, never an unknown as 0."""
    if stats.turns and stats.uncounted == stats.turns:
        return "in=?, out=?, total=? (the model server gave no counts)"
    counts = f"in={stats.input}, out={stats.output}, total={stats.input + stats.output}"
    if stats.uncounted:
        counts += f" (+ {stats.uncounted} of {stats.turns} turns not counted)"
    return counts


def background_counts(usage: dict[str, FeatureUsage]) -> str:
    """``; background: 12 calls, total=6510``: the model calls the agent made for itself
    (memory review, reflection…), which the turns' counts leave out; "" when there were none."""
    if not usage:
        return ""
    calls = sum(u.calls for u in usage.values())
    total = sum(u.input + u.output for u in usage.values())
    return f"; background: {calls} calls, total={total}"


def plugins_command(as_json: bool) -> int:
    """Always runs, whatever is wrong: a conflict or a failing plugin is shown, not raised."""
    from agentik.core.app import declared_settings, llm_choice, registries
    from agentik.core.plugins import PluginError, StartupError, make_plugins
    from agentik.core.settings import (
        Setting,
        SettingPrefix,
        Settings,
        SettingsError,
        undeclared_variables,
    )

    try:
        plugins = make_plugins()
    except (StartupError, SettingsError) as e:  # strict mode, or an invalid plugin switch
        return fail(str(e), e)
    problems = list(plugins.warnings)
    regs = registries(plugins, problems)
    try:
        items = declared_settings(plugins)
    except PluginError as e:
        problems.append(str(e))
        items = []
    declared = [s for s in items if isinstance(s, Setting)]
    prefixes = {
        "AGENTIK_": None,
        **{p.prefix: p.plugin for p in items if isinstance(p, SettingPrefix)},
    }
    try:
        settings: dict[str, Any] = dict(Settings(declared))
        invalid = None
    except SettingsError as e:
        settings, invalid = {}, str(e)
    others = [name for p in items if isinstance(p, SettingPrefix) for name in p.others]
    problems += undeclared_variables((s.name for s in declared), prefixes=prefixes, others=others)
    llm, why = llm_choice(Settings(declared)) if not invalid else (None, None)
    selected = {
        "llm": llm,
        "memory": None
        if "off" in (settings.get("AGENTIK_MEMORY_DIR"), None)
        else settings.get("AGENTIK_MEMORY_BACKEND"),
        "embedding": settings.get("AGENTIK_EMBEDDING_BACKEND"),  # used by a memory that needs one
    }
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
                "reason": info.reason,
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
    choice = {"backend": llm, "reason": why or ("AGENTIK_LLM_BACKEND" if llm else None)}
    if as_json:
        print(
            json.dumps(
                {
                    "plugins": report,
                    "llm": choice,
                    "invalidSettings": invalid,
                    "problems": problems,
                },
                indent=2,
            )
        )
        return 0
    for p in report:
        version = f" {p['version']}" if p["version"] else ""
        if p["dist"] and p["dist"].endswith(".py"):  # a single-file plugin: where it is
            version += f" ({p['dist']})"
        why = f": {p['error']}" if p["error"] else (f" by {p['reason']}" if p["reason"] else "")
        print(f"{p['name']}{version} [{p['status']}]{why}")
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
    if llm:
        print(f"llm: {llm} ({choice['reason']})")
    if invalid:
        print(f"invalid settings: {invalid}")
    for problem in problems:
        print(f"problem: {problem}")
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
        return ",".join(str(v) for v in value) or None
    return None if value is None else str(value)


def settings_table() -> str:
    """The README's configuration table, generated from what the plugins declare."""
    from agentik.core.app import declared_settings
    from agentik.core.plugins import make_plugins
    from agentik.core.settings import Setting

    rows = ["| Variable | Default | Plugin | Meaning |", "|---|---|---|---|"]
    declared = [s for s in declared_settings(make_plugins(env={})) if isinstance(s, Setting)]
    plugins: dict[str, list[str]] = {}  # a variable shared on purpose: one row, every plugin
    for s in declared:
        plugins.setdefault(s.name, []).append(str(s.plugin))
    for s in declared:
        if s.plugin != plugins[s.name][0]:
            continue
        shown = _show(s.default)
        default = "—" if shown is None else f"`{shown}`"
        rows.append(f"| `{s.name}` | {default} | {', '.join(plugins[s.name])} | {s.help} |")
    return "\n".join(rows)
