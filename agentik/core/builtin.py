"""The core's own plugin: the settings the core reads and the base system prompt."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentik.core.limits import LOOPBACK_PROXIES, parse_trusted_proxies
from agentik.core.memory import parse_memory_dir
from agentik.core.security import parse_api_keys
from agentik.core.settings import (
    Setting,
    Settings,
    parse_bool,
    parse_choice,
    parse_list,
    parse_non_negative_float,
    parse_path,
    parse_port,
    parse_positive_float,
    parse_positive_int,
)
from agentik.core.store.url import parse_database_url
from agentik.hookspecs import hookimpl

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant. Be brief and to the point."
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

CORE_SETTINGS = (
    Setting(
        "AGENTIK_HOST",
        None,
        str,
        "Interface the HTTP server binds to; unset: 127.0.0.1 without AGENTIK_API_KEY, "
        "0.0.0.0 with it.",
    ),
    Setting(
        "AGENTIK_API_KEY",
        None,
        parse_api_keys,
        "API keys every route requires (`Authorization: Bearer <key>`): a comma list, or "
        "@/path/to/file with one key per line; each at least 16 characters.",
        secret=True,
    ),
    Setting(
        "AGENTIK_ALLOW_UNAUTHENTICATED",
        False,
        parse_bool,
        "1 allows binding a non-loopback AGENTIK_HOST without AGENTIK_API_KEY (behind an "
        "authenticating proxy).",
    ),
    Setting(
        "AGENTIK_ALLOWED_HOSTS",
        None,
        parse_list,
        "Comma list of Host names served besides the loopback ones (`*`: any); unset: only "
        "loopback names without a key, any name with one (against DNS rebinding).",
    ),
    Setting(
        "AGENTIK_CORS_ORIGINS",
        (),
        parse_list,
        "Comma list of browser origins (https://app.example.com) allowed to call the API.",
    ),
    Setting("AGENTIK_PORT", 8080, parse_port, "Port of the HTTP server (all transports)."),
    Setting(
        "AGENTIK_DB_PATH",
        "./agentik.db",
        str,
        "SQLite file for conversations and history; ':memory:' for an in-memory database. "
        "Missing parent folders are created.",
    ),
    Setting(
        "AGENTIK_DATABASE_URL",
        None,
        parse_database_url,
        "PostgreSQL server for the store instead of SQLite (postgresql://user:password@host/db; "
        "needs the `postgres` extra); unset: the SQLite file AGENTIK_DB_PATH.",
        secret=True,
    ),
    Setting(
        "AGENTIK_LLM_BACKEND",
        None,
        str.lower,
        "LLM backend by name (see `agentik plugins`); unset: `openai` when an OPENAI_* variable "
        "is set, else the on-device `litert` with its default model (downloaded once).",
    ),
    Setting(
        "AGENTIK_MEMORY_BACKEND",
        "md",
        str.lower,
        "Long-term memory backend by name (see `agentik plugins`); `off` turns memory off.",
    ),
    Setting(
        "AGENTIK_EMBEDDING_BACKEND",
        "http",
        str.lower,
        "Embedding backend by name (see `agentik plugins`), built only for a memory backend "
        "that needs one (vector).",
    ),
    Setting(
        "AGENTIK_MEMORY_DIR",
        "~/.agentik/memory",
        parse_memory_dir,
        "Folder of the long-term memory files (md backend); `off` turns memory off.",
    ),
    Setting("AGENTIK_SYSTEM_PROMPT", DEFAULT_SYSTEM_PROMPT, str, "Base system prompt."),
    Setting("AGENTIK_LOG_LEVEL", "info", parse_choice(*LOG_LEVELS), "Logging level."),
    Setting(
        "AGENTIK_LOG_FORMAT",
        "text",
        parse_choice("text", "json"),
        "`json`: one JSON object per log line (time, level, logger, message, and the "
        "conversation, turn and trace ids inside a turn).",
    ),
    Setting(
        "AGENTIK_EVENT_BUFFER",
        1024,
        parse_positive_int,
        "Events kept per stream for clients resuming with Last-Event-ID.",
    ),
    Setting(
        "AGENTIK_TOOL_TIMEOUT",
        120.0,
        parse_positive_float,
        "Seconds an in-agent tool call may take before the model gets an error result.",
    ),
    Setting(
        "AGENTIK_BEFORE_TURN_TIMEOUT",
        10.0,
        parse_positive_float,
        "Seconds a turn waits for the plugins' before_turn work (memory prefetch); one that is "
        "later is left out of that turn, with a warning naming its plugin.",
    ),
    Setting(
        "AGENTIK_SERVICE_START_TIMEOUT",
        120.0,
        parse_positive_float,
        "Seconds a plugin's service may take to start before start-up stops naming it.",
    ),
    Setting(
        "AGENTIK_MAX_TOOL_ROUNDS",
        20,
        parse_positive_int,
        "Tool rounds a turn may take; then the model gets one last request without tools, and "
        "a turn whose model still calls one ends with an error.",
    ),
    Setting(
        "AGENTIK_BACKGROUND_IDLE",
        10.0,
        parse_non_negative_float,
        "Seconds without a user turn before background model calls (memory review, reflection, "
        "skill mining) run; a turn that starts cuts the call under way short. 0: right away.",
    ),
    Setting(
        "AGENTIK_LEASE_TTL",
        10.0,
        parse_positive_float,
        "Many instances on one PostgreSQL: seconds an instance that stops beating (hung, cut "
        "off) keeps its conversations before another takes them over; it beats every third.",
    ),
    Setting(
        "AGENTIK_LIVE_CONVERSATIONS",
        256,
        parse_positive_int,
        "Idle conversations kept in memory (live LLM context, event buffer); older ones are "
        "reloaded from the database on demand.",
    ),
    Setting(
        "AGENTIK_KEEPALIVE_TIMEOUT",
        15.0,
        parse_positive_float,
        "Seconds a connection may stay idle, or take to send a request's headers, before it is "
        "closed.",
    ),
    Setting(
        "AGENTIK_MAX_CONNECTIONS",
        1000,
        parse_positive_int,
        "Open connections served at once (SSE streams included); one more gets a 503 and is "
        "closed. The file-descriptor limit is raised to fit, or the cap lowered with a warning.",
    ),
    Setting(
        "AGENTIK_MAX_CLIENT_CONNECTIONS",
        100,
        parse_positive_int,
        "Connections one client (an IP address; an IPv6 /64) may hold at once, or, behind a "
        "trusted proxy, requests (SSE streams included); one more gets a 429.",
    ),
    Setting(
        "AGENTIK_CLIENT_CONNECTION_RATE",
        20.0,
        parse_positive_float,
        "New connections one client may open per second (bursts of twice as many); one more "
        "gets a 429.",
    ),
    Setting(
        "AGENTIK_TRUSTED_PROXIES",
        parse_trusted_proxies(",".join(LOOPBACK_PROXIES)),
        parse_trusted_proxies,
        "Comma list of proxy addresses or networks whose X-Forwarded-For names the client "
        "(per-client limits apply to it); `none` trusts none. Default: loopback.",
    ),
    Setting(
        "AGENTIK_WRITE_TIMEOUT",
        30.0,
        parse_positive_float,
        "Seconds a client may read nothing of what the server sends it (a page, a stream) "
        "before its connection is dropped.",
    ),
    Setting(
        "AGENTIK_BODY_TIMEOUT",
        30.0,
        parse_positive_float,
        "Seconds a client may take to send a request's body (408 after that).",
    ),
    Setting(
        "AGENTIK_RESUME_QUEUED",
        True,
        parse_bool,
        "After a restart, run the acknowledged messages whose turns never started, in order "
        "(0: close them with a `restart` Error record).",
    ),
    Setting(
        "AGENTIK_RESUME_TURNS",
        True,
        parse_bool,
        "After a crash, resume a turn that was running from its last recorded step (a tool "
        "whose result was recorded never runs twice); 0: close it with a `restart` Error record.",
    ),
    Setting(
        "AGENTIK_SHUTDOWN_TIMEOUT",
        5.0,
        parse_positive_float,
        "Seconds the whole stop may take (SIGTERM to exit; keep it under an orchestrator's "
        "grace period, e.g. Docker's 10 s): requests left then are cut, the process exits.",
    ),
    Setting(
        "AGENTIK_LOAD_PLUGINS",
        None,
        parse_list,
        "Comma list of plugins (entry points or distributions) to load; `none` loads none.",
    ),
    Setting("AGENTIK_DISABLE_PLUGINS", (), parse_list, "Comma list of plugins not to load."),
    Setting(
        "AGENTIK_STRICT_PLUGINS",
        False,
        parse_bool,
        "1 makes a plugin that fails to load stop start-up (for development and CI).",
    ),
    Setting(
        "AGENTIK_PLUGINS_DIR",
        None,
        parse_path,
        "Folder of single-file plugins: every *.py in it is loaded as a plugin, without "
        "packaging (named after the file).",
    ),
    Setting(
        "AGENTIK_TRACE_PLUGINS",
        False,
        parse_bool,
        "1 logs hook calls: the implementations called, the arguments, the results (debugging).",
    ),
)


PLUGIN_SWITCHES = tuple(s for s in CORE_SETTINGS if s.name.endswith(("_PLUGINS", "_PLUGINS_DIR")))


@hookimpl
def register_settings(register: Callable[[Setting], None]) -> None:
    for setting in CORE_SETTINGS:
        register(setting)


@hookimpl
def register_prompt_sections(register: Callable[..., Any], settings: Settings) -> None:
    prompt = settings["AGENTIK_SYSTEM_PROMPT"]
    register("base", lambda: prompt, order=100)
