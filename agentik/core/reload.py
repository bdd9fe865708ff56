"""``agentik serve --reload``: the dev loop of a plugin author.

The server runs as a child process (``agentik serve``, the same arguments and environment);
this process only watches files and never imports a plugin. When a watched file changes, the
child is stopped as Ctrl-C stops it (running turns are recorded, queued messages stay queued)
and a new one starts with the new code: conversations are in the database, so they survive
(not with ``AGENTIK_DB_PATH=:memory:``). A child that stops on its own (a start-up error in the
plugin being written) is started again at the next change.

Watched: every ``*.py`` of ``AGENTIK_PLUGINS_DIR`` (new files too), the sources of every
installed plugin (the modules and packages the ``agentik`` entry points name: an editable
install's are the files being edited), and the ``site-packages`` folders, so a ``pip install``
of a new plugin restarts it too. Polling, every ``INTERVAL`` seconds: no dependency.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from agentik import hookspecs

INTERVAL = 0.5  # seconds between two looks at the files
SETTLE = 0.3  # seconds without a further change before restarting (an editor saves in steps)


def plugin_sources() -> list[Path]:
    """The source files of every installed plugin (the modules and packages the ``agentik``
    entry points name), found without running them, and the folders packages install into."""
    files: set[Path] = set()
    for ep in importlib.metadata.entry_points(group=hookspecs.PROJECT):
        top = ep.value.split(":")[0].split(".")[0]
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        for folder in spec.submodule_search_locations or ():
            files.update(Path(folder).rglob("*.py"))
        if spec.origin and spec.origin.endswith(".py"):
            files.add(Path(spec.origin))
    # a pip install or uninstall changes these folders (its dist-info comes or goes)
    files.update(Path(p) for p in sys.path if Path(p).name in ("site-packages", "dist-packages"))
    return sorted(files)


def watched_files(plugins_dir: Path | None, sources: Sequence[Path]) -> list[Path]:
    """The files whose change restarts the server: the plugins folder's ``*.py`` (looked up
    each time: a new file counts) and the installed plugins' sources."""
    found = sorted(plugins_dir.glob("*.py")) if plugins_dir is not None else []
    return [*found, *sources]


def snapshot(files: Sequence[Path]) -> dict[Path, float]:
    out = {}
    for path in files:
        try:
            out[path] = path.stat().st_mtime
        except OSError:
            out[path] = -1.0  # gone: a change too
    return out


def changed(before: Mapping[Path, float], after: Mapping[Path, float]) -> list[Path]:
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


class Reloader:
    def __init__(self, argv: Sequence[str], plugins_dir: Path | None, stop_timeout: float) -> None:
        self.argv = list(argv)
        self.plugins_dir = plugins_dir
        self.stop_timeout = stop_timeout
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False

    def start(self) -> None:
        # its own session: a Ctrl-C reaches this process only, which stops the child once
        self.child = subprocess.Popen(self.argv, start_new_session=True)
        say(f"serving (pid {self.child.pid}); watching the plugins' sources for changes")

    def stop(self) -> int | None:
        child, self.child = self.child, None
        if child is None:
            return None
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                return child.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                say(f"the server did not stop within {self.stop_timeout:g} s: killed")
                child.kill()
        return child.wait()

    def run(self) -> int:
        def on_signal(signum: int, frame: object) -> None:
            self.stopping = True

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
        sources = plugin_sources()
        seen = snapshot(watched_files(self.plugins_dir, sources))
        self.start()
        reported = False
        while not self.stopping:
            time.sleep(INTERVAL)
            if self.child is not None and self.child.poll() is not None and not reported:
                say(f"the server stopped (exit {self.child.returncode}); waiting for a change")
                reported = True
            now = snapshot(watched_files(self.plugins_dir, sources))
            diff = changed(seen, now)
            if not diff:
                continue
            while True:  # until the files settle
                time.sleep(SETTLE)
                sources = plugin_sources()  # a new plugin, a new module in a plugin
                settled = snapshot(watched_files(self.plugins_dir, sources))
                if not changed(now, settled):
                    break
                now = settled
            seen = settled
            shown = ", ".join(str(p) for p in diff[:3]) + (" …" if len(diff) > 3 else "")
            say(f"{shown} changed: restarting")
            self.stop()
            if not self.stopping:
                self.start()
                reported = False
        self.stop()
        say("stopped")
        return 0


def say(text: str) -> None:
    print(f"agentik --reload: {text}", file=sys.stderr, flush=True)


def serve_with_reload(host: str | None, port: int | None, env: Mapping[str, str]) -> int:
    """``agentik serve --reload``: the command line of the child, then the watch loop."""
    from agentik.core.builtin import CORE_SETTINGS
    from agentik.core.settings import Settings

    wanted = ("AGENTIK_PLUGINS_DIR", "AGENTIK_SHUTDOWN_TIMEOUT", "AGENTIK_DB_PATH")
    settings = Settings([s for s in CORE_SETTINGS if s.name in wanted], env)
    if settings["AGENTIK_DB_PATH"] == ":memory:":
        say("AGENTIK_DB_PATH=:memory: — conversations do not survive a restart")
    argv = [sys.executable, "-m", "agentik", "serve"]
    argv += ["--host", host] if host else []
    argv += ["--port", str(port)] if port is not None else []
    # the child's own shutdown waits AGENTIK_SHUTDOWN_TIMEOUT for turns; then some slack
    stop_timeout = settings["AGENTIK_SHUTDOWN_TIMEOUT"] + 10
    os.environ.setdefault("PYTHONUNBUFFERED", "1")  # the child's banner shows at once
    return Reloader(argv, settings["AGENTIK_PLUGINS_DIR"], stop_timeout).run()
