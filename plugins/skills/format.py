"""The skill file formats and their rules (agentskills.io), with nothing about folders or caching.

A skill is a ``SKILL.md`` (YAML front matter between ``---`` lines, then a markdown body) or a
plain ``*.yaml``/``*.yml`` mapping with ``name``, ``description`` and an optional ``body``.
Names follow agentskills.io: 1-64 of ``a-z0-9-``, no leading, trailing or double hyphen; the
seeds' ``:`` nests them (``backend:spring:db-base`` is the folder ``backend/spring/db-base``),
so every ``:``-separated part follows the rule. Those rules also make a name a safe relative
path: no ``..``, ``/``, ``\\``, NUL or absolute path can pass them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

#: libyaml's safe loader when pyyaml was built with it (about 10x faster), else the pure one
SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """Safe dumper that writes multi-line text as a literal ``|`` block (readable bodies)."""


def _str(dumper: Any, value: str) -> Any:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)

NAME_PART = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
MAX_NAME = 64  # per part (agentskills.io)
MAX_PARTS = 8  # nesting depth of a:b:c names
MAX_DESCRIPTION = 1024
MAX_COMPATIBILITY = 500
MAX_FILE_BYTES = 256 * 1024  # a skill file larger than this is skipped as broken
MAX_BODY_CHARS = 100_000  # what skill_save accepts
SKILL_MD = "SKILL.md"
YAML_SUFFIXES = (".yaml", ".yml")
#: front-matter fields agentskills.io allows; skill_save writes only these
SPEC_FIELDS = ("name", "description", "license", "compatibility", "metadata", "allowed-tools")


class SkillError(ValueError):
    """A skill name, file or field that breaks the rules; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Skill:
    """One skill of the catalogue. The body is not kept: read it with the catalogue."""

    name: str  # the full name, ``a:b:c`` for nested ones
    description: str  # one line
    path: str  # the file, relative to the skills folder (posix separators)
    license: str | None = None
    compatibility: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    allowed_tools: str | None = None

    @property
    def is_yaml(self) -> bool:
        return self.path.endswith(YAML_SUFFIXES)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "description": self.description}
        out["path"] = self.path
        for key in ("license", "compatibility", "allowed_tools"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        return out


def name_parts(name: Any) -> list[str]:
    """The ``:``-separated parts of a valid skill name; :class:`SkillError` says what is wrong."""
    if not isinstance(name, str) or not name:
        raise SkillError("the name must be a non-empty string")
    if len(name) > MAX_PARTS * (MAX_NAME + 1):
        raise SkillError(f"the name is too long ({len(name)} characters)")
    parts = name.split(":")
    if len(parts) > MAX_PARTS:
        raise SkillError(f"the name nests more than {MAX_PARTS} levels")
    for part in parts:
        if not part:
            raise SkillError(f"{name!r} has an empty part between ':'")
        if len(part) > MAX_NAME:
            raise SkillError(f"{part[:20]!r}… is longer than {MAX_NAME} characters")
        if not NAME_PART.fullmatch(part):
            raise SkillError(
                f"{part!r} is not a skill name: lowercase letters, digits and single hyphens "
                "only, not at the start or end"
            )
    return parts


def clean_description(description: Any) -> str:
    """The description on one line; :class:`SkillError` when missing or over 1024 chars."""
    if not isinstance(description, str) or not description.strip():
        raise SkillError("the description must be a non-empty string")
    line = " ".join(description.split())
    if len(line) > MAX_DESCRIPTION:
        raise SkillError(f"the description is longer than {MAX_DESCRIPTION} characters")
    return line


def _optional_str(fields: dict[str, Any], key: str, limit: int | None = None) -> str | None:
    value = fields.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise SkillError(f"{key} must be a string")
    if limit is not None and len(value) > limit:
        raise SkillError(f"{key} is longer than {limit} characters")
    return value


def skill_from_fields(name: str, fields: dict[str, Any], path: str) -> Skill:
    """Check a parsed skill's fields and make its :class:`Skill` (``name`` already checked)."""
    metadata = fields.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise SkillError("metadata must be a mapping")
    tools = fields.get("allowed-tools")
    if isinstance(tools, list):  # Claude Code writes a list; the spec a space-separated string
        tools = " ".join(str(t) for t in tools)
    return Skill(
        name=name,
        description=clean_description(fields.get("description")),
        path=path,
        license=_optional_str(fields, "license"),
        compatibility=_optional_str(fields, "compatibility", MAX_COMPATIBILITY),
        metadata={str(k): str(v) for k, v in metadata.items()},
        allowed_tools=None if tools is None else str(tools),
    )


def decode(raw: bytes) -> str:
    if len(raw) > MAX_FILE_BYTES:
        raise SkillError(f"the file is larger than {MAX_FILE_BYTES // 1024} KiB")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SkillError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None


def _load_mapping(text: str, what: str) -> dict[str, Any]:
    try:
        value = yaml.load(text, Loader=SafeLoader)  # a safe loader (C or pure)
    except yaml.YAMLError as e:
        raise SkillError(f"bad YAML in {what}: {' '.join(str(e).split())}") from None
    if not isinstance(value, dict):
        raise SkillError(f"{what} is not a YAML mapping")
    return value


def split_skill_md(text: str) -> tuple[dict[str, Any], str]:
    """A ``SKILL.md``'s front matter (a mapping) and its body."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip() != "---":
        raise SkillError("SKILL.md must start with a '---' line and YAML front matter")
    for i, line in enumerate(lines[1:], 1):
        if line.rstrip() == "---":
            front = "".join(lines[1:i])
            return _load_mapping(front, "the front matter"), "".join(lines[i + 1 :]).strip()
    raise SkillError("the front matter is not closed by a '---' line")


def parse_yaml_skill(text: str) -> tuple[dict[str, Any], str]:
    """A YAML skill's fields and its body (``body``, may be empty)."""
    fields = _load_mapping(text, "the file")
    body = fields.get("body") or ""
    if not isinstance(body, str):
        raise SkillError("body must be a string")
    return fields, body.strip()


def render_skill_md(fields: dict[str, Any], body: str) -> str:
    """A ``SKILL.md`` that agentskills.io's reference parser (``skills-ref``) reads back: block
    YAML, one key per line, no ``---`` inside the front matter (that parser splits on it)."""
    kept = {k: fields[k] for k in SPEC_FIELDS if fields.get(k) not in (None, "", {})}
    front = yaml.dump(kept, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1_000_000)
    if "---" in front:
        raise SkillError("the name and description must not contain '---'")
    return f"---\n{front}---\n\n{body.strip()}\n"


def render_yaml_skill(fields: dict[str, Any]) -> str:
    return str(
        yaml.dump(fields, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1_000_000)
    )
