"""Declared settings, parsed once from the environment and validated together.

The core and every plugin declare what they read (``register_settings``); start-up parses all
of them at once: blank or missing means the default, and an invalid value stops start-up with
one line naming the variable. Plugins never read ``os.environ`` themselves.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class SettingsError(Exception):
    """An invalid or missing setting; the message names the variable."""


def parse_int(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError("must be a whole number, e.g. 10") from None


def parse_positive_int(raw: str) -> int:
    value = parse_int(raw)
    if value <= 0:
        raise ValueError("must be a whole number greater than 0")
    return value


def parse_non_negative_int(raw: str) -> int:
    value = parse_int(raw)
    if value < 0:
        raise ValueError("must be a whole number, 0 or more")
    return value


def parse_port(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise ValueError("must be a port number (0-65535)")
    return value


def _finite(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("must be a number, e.g. 2.5") from None
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def parse_fraction(raw: str) -> float:
    value = _finite(raw)
    if not 0 < value <= 1:
        raise ValueError("must be a number in (0, 1]")
    return value


def parse_non_negative_float(raw: str) -> float:
    value = _finite(raw)
    if value < 0:
        raise ValueError("must be 0 or more")
    return value


def parse_positive_float(raw: str) -> float:
    value = _finite(raw)
    if value <= 0:
        raise ValueError("must be greater than 0")
    return value


def parse_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be 1/0, true/false, yes/no or on/off")


def parse_list(raw: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in raw.split(",") if item.strip())


def parse_choice(*choices: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    return parse


def parse_url(raw: str) -> str:
    value = raw.strip()
    if not value.startswith(("http://", "https://")):
        raise ValueError("must be an http:// or https:// URL")
    return value.rstrip("/")


def parse_url_path(raw: str) -> str:
    """Where a transport is mounted: ``/agui``, ``/mcp`` (no trailing slash kept)."""
    path = raw.strip().rstrip("/")
    if not path.startswith("/") or len(path) < 2 or any(c in path for c in " ?#{}%"):
        raise ValueError("must be a URL path such as /agui (no spaces, query or braces)")
    return path


def parse_path(raw: str) -> Path:
    return Path(raw).expanduser()


class SecretSafeError(ValueError):
    """An invalid value whose message quotes none of it: shown even for a secret setting."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One environment variable: its name, default, parser and a line of help."""

    name: str
    default: Any = None
    parse: Callable[[str], Any] = str
    help: str = ""
    secret: bool = False
    plugin: str | None = None

    def describe_default(self) -> str:
        return "—" if self.default is None else str(self.default)

    def agrees_with(self, other: Setting) -> bool:
        """Two plugins may share a variable when they declare it alike (same default, parser
        and secrecy); the help text may differ."""
        return (
            self.default == other.default
            and self.secret == other.secret
            and _same_parser(self.parse, other.parse)
        )


@dataclass(frozen=True, slots=True)
class SettingPrefix:
    """Claims every variable that starts with ``prefix`` (``"HEARTBEAT_"``) for the plugin: one
    set in the environment that no plugin declares gets the same "did you mean" warning at
    start-up as an unknown ``AGENTIK_*`` variable, so a typo (``HEARTBEAT_INTERVL``) is not
    silently ignored. ``register(SettingPrefix("HEARTBEAT_"))`` in ``register_settings``.
    ``others``: variables under the prefix that other programs read (the ``openai`` SDK's
    ``OPENAI_ORG_ID``), never warned about."""

    prefix: str
    plugin: str | None = None
    others: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Z][A-Z0-9]+_", self.prefix):
            raise ValueError(
                f"SettingPrefix({self.prefix!r}): a prefix is upper-case letters and digits "
                "ending with '_', e.g. 'HEARTBEAT_'"
            )


def _same_parser(a: Callable[[str], Any], b: Callable[[str], Any]) -> bool:
    if a is b or a == b:
        return True
    # parse_choice("a", "b") builds a new function each time: alike if code and choices are
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    if code_a is None or code_a is not code_b:
        return False
    cells = [tuple(c.cell_contents for c in f.__closure__ or ()) for f in (a, b)]
    return cells[0] == cells[1]


def setting_conflicts(declared: Iterable[Setting]) -> list[str]:
    """One line per variable that two plugins declare differently."""
    first: dict[str, Setting] = {}
    problems = []
    for s in declared:
        other = first.setdefault(s.name, s)
        if other is not s and not other.agrees_with(s):
            problems.append(
                f"{s.name} is declared differently by {other.plugin} (default: "
                f"{other.describe_default()}) and {s.plugin} (default: {s.describe_default()}); "
                "disable one with AGENTIK_DISABLE_PLUGINS"
            )
    return problems


def undeclared_variables(
    declared: Iterable[str],
    env: Mapping[str, str] | None = None,
    prefixes: Mapping[str, str | None] | Iterable[str] = ("AGENTIK_",),
    others: Iterable[str] = (),
) -> list[str]:
    """A warning for each variable set in the environment under one of ``prefixes``
    (``AGENTIK_*`` and the prefixes plugins claim with :class:`SettingPrefix`, mapped to the
    plugin) that no loaded plugin declares (a typo, or the feature's plugin is gone), with the
    closest declared name; ``others`` (other programs' variables under a claimed prefix) are
    left alone."""
    env = os.environ if env is None else env
    names = set(declared)
    owners = dict(prefixes) if isinstance(prefixes, Mapping) else dict.fromkeys(prefixes)
    skip = frozenset(others)
    warnings = []
    for var in sorted(env):
        prefix = next((p for p in owners if var.startswith(p)), None)
        if prefix is None or var in names or var in skip:
            continue
        import difflib  # only for a variable no plugin declares (0.2 MiB of idle RSS)

        match = difflib.get_close_matches(var, sorted(names), n=1)
        hint = f" (did you mean {match[0]}?)" if match else ""
        owner = f" ({prefix}* belongs to plugin {owners[prefix]})" if owners[prefix] else ""
        warnings.append(
            f"{var} is set but no loaded plugin declares it{hint}{owner}; it is ignored"
        )
    return warnings


class Settings(Mapping[str, Any]):
    """Parsed values by variable name. Use ``settings["AGENTIK_PORT"]``."""

    def __init__(
        self, declared: Iterable[Setting | SettingPrefix], env: Mapping[str, str] | None = None
    ) -> None:
        env = os.environ if env is None else env
        items = list(declared)
        #: the prefixes plugins claim (:class:`SettingPrefix`) -> the plugin, ``AGENTIK_`` first
        self.prefixes: dict[str, str | None] = {"AGENTIK_": None}
        #: other programs' variables under those prefixes (``SettingPrefix.others``)
        self.others: set[str] = set()
        for item in items:
            if isinstance(item, SettingPrefix):
                self.prefixes.setdefault(item.prefix, item.plugin)
                self.others.update(item.others)
        settings = [s for s in items if isinstance(s, Setting)]
        errors = setting_conflicts(settings)
        self.declared: dict[str, Setting] = {}
        #: the variables the environment set (the others have their defaults)
        self.explicit: set[str] = set()
        values: dict[str, Any] = {}
        for s in settings:
            if s.name in self.declared:
                continue  # a variable shared on purpose, declared alike by both plugins
            self.declared[s.name] = s
            raw = env.get(s.name, "")
            if not raw.strip():
                values[s.name] = s.default
                continue
            self.explicit.add(s.name)
            try:
                values[s.name] = s.parse(raw.strip())
            except (ValueError, TypeError) as e:
                # a parser's message may quote the value: a secret's only when it says it won't
                why = f": {e}" if not s.secret or isinstance(e, SecretSafeError) else ""
                errors.append(
                    f"{s.name}=*** is invalid{why}"
                    if s.secret
                    else f"{s.name}={raw.strip()!r} is invalid{why}"
                )
        if errors:
            raise SettingsError("; ".join(errors))
        self._values = values

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Any:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def require(self, *names: str, hint: str = "") -> None:
        """Fail with one line naming every missing variable (for settings a backend needs)."""
        missing = [n for n in names if self._values.get(n) in (None, "")]
        if missing:
            raise SettingsError(f"{', '.join(missing)} must be set" + (f". {hint}" if hint else ""))
