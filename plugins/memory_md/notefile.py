"""The Hermes-style note files: parse them (keeping whatever does not parse) and render them.

A file is a sequence of notes, each a header line, a blank line and the markdown body::

    § id=4f0c2a9e1b7d created=2026-11-30T22:01:05Z uses=2 last_used=2026-12-01T08:00:00Z source=USER

    The user's name is Alice.

Only ``§`` at the start of a line opens a header. A body line that starts with ``§`` (after any
number of backslashes) is written with one more backslash in front and read back with one
less, so a note's text can never open a header. Header fields are ``key=value``; ``id``,
``created``, ``uses``, ``last_used`` and ``source`` may be left out of a note written by hand
(its id is then derived from its text; created is the file's time). Anything that does not
parse — text before the first header, a header with a bad field, a note without text, a
duplicate id — is a *bad part*: reported, left exactly as it is in the file, and not used.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from agentik.core.memory import SOURCES, Note

HEADER = re.compile(r"^§(?:[ \t](.*))?$")
ESCAPED = re.compile(r"^\\*§")
ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
NEVER = "never"


@dataclass(slots=True)
class Chunk:
    """A piece of a file: a note (``text`` as read, or its rendering once it changed) or a bad
    part (``text`` verbatim)."""

    text: str
    note: Note | None = None
    extra: dict[str, str] = field(default_factory=dict)  # unknown header fields, kept


@dataclass(slots=True)
class Parsed:
    chunks: list[Chunk]
    problems: list[str]


def iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(raw: str) -> datetime:
    when = datetime.fromisoformat(raw)
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def derived_id(category: str, text: str) -> str:
    return "h" + hashlib.sha1(f"{category}\n{text}".encode()).hexdigest()[:11]


def escape(body: str) -> str:
    return "\n".join("\\" + line if ESCAPED.match(line) else line for line in body.split("\n"))


def unescape(line: str) -> str:
    return line[1:] if line.startswith("\\") and ESCAPED.match(line) else line


def render_note(note: Note, extra: dict[str, str] | None = None) -> str:
    fields = [
        f"id={note.id}",
        f"created={iso(note.created)}",
        f"uses={note.uses}",
        f"last_used={iso(note.last_used) if note.last_used else NEVER}",
        f"source={note.source}",
        *(f"{k}={v}" for k, v in (extra or {}).items()),
    ]
    return f"§ {' '.join(fields)}\n\n{escape(note.text.strip())}\n\n"


def note_chunk(note: Note, extra: dict[str, str] | None = None) -> Chunk:
    return Chunk(render_note(note, extra), note, dict(extra or {}))


def render(chunks: Iterable[Chunk]) -> str:
    return "".join([c.text for c in chunks])


def append(chunks: list[Chunk], chunk: Chunk) -> list[Chunk]:
    """``chunks`` and ``chunk`` after them; a last bad part without a final newline gets one, so
    the new note's header starts a line."""
    if chunks and not chunks[-1].text.endswith("\n"):
        last = chunks[-1]
        chunks = [*chunks[:-1], Chunk(last.text + "\n", last.note, last.extra)]
    return [*chunks, chunk]


def parse(text: str, category: str, default_time: datetime, name: str) -> Parsed:
    """The chunks of a file; ``name`` is how problems refer to it (``user.md``)."""
    lines = text.split("\n")
    # split into [preamble, note, note, ...]: each a (first line number, lines) pair
    groups: list[tuple[int, list[str]]] = [(1, [])]
    for n, line in enumerate(lines, start=1):
        if HEADER.match(line.rstrip("\r")):
            groups.append((n, [line]))
        else:
            groups[-1][1].append(line)
    chunks: list[Chunk] = []
    problems: list[str] = []
    last = len(groups) - 1
    for i, (start, group) in enumerate(groups):
        raw = "\n".join(group) + ("" if i == last else "\n")
        if i == 0:
            if raw.strip():
                problems.append(f"{name} line 1: text before the first note header")
                chunks.append(Chunk(raw))
            continue
        try:
            note, extra = _note(group, category, default_time)
        except ValueError as e:
            problems.append(f"{name} line {start}: {e}")
            chunks.append(Chunk(raw))
            continue
        chunks.append(Chunk(raw, note, extra))  # as written, until the note changes
    return Parsed(chunks, problems)


def _note(group: list[str], category: str, default_time: datetime) -> tuple[Note, dict[str, str]]:
    match = HEADER.match(group[0].rstrip("\r"))
    assert match is not None
    fields: dict[str, str] = {}
    for token in (match.group(1) or "").split():
        key, eq, value = token.partition("=")
        if not eq or not key:
            raise ValueError(f"header field {token!r} is not key=value")
        fields[key] = value
    body = "\n".join(group[1:]).strip()
    if "\r" in body or "\\" in body:  # rare: CRLF files, escaped header lines
        body = "\n".join(unescape(line.rstrip("\r")) for line in group[1:]).strip()
    if not body:
        raise ValueError("a note without text")
    note_id = fields.pop("id", "") or derived_id(category, body)
    if not ID.match(note_id):
        raise ValueError(f"bad id {note_id!r}")
    try:
        created = parse_time(fields.pop("created")) if "created" in fields else default_time
        used = fields.pop("last_used", NEVER)
        last_used = None if used in (NEVER, "", "-") else parse_time(used)
        uses = int(fields.pop("uses", "0"))
    except ValueError as e:
        raise ValueError(f"bad header: {e}") from None
    if uses < 0:
        raise ValueError("bad header: uses must be 0 or more")
    source = fields.pop("source", "USER")
    if source not in SOURCES:
        raise ValueError(f"bad source {source!r}")
    return Note(note_id, category, body, source, created, last_used, uses), fields


def touched(note: Note, now: datetime) -> Note:
    # Note(...) directly: dataclasses.replace costs several times more
    return Note(note.id, note.category, note.text, note.source, note.created, now, note.uses + 1)
