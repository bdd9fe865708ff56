"""The skills folder as a catalogue: what is in it, kept current cheaply, and safe ways to read,
save and archive skills in it.

Change detection: a scan lists every candidate file with its (mtime, size, inode) stamp — one
``scandir`` per folder and one ``stat`` per file (B18: 0.1 s for 1,000 skills on a busy
machine) — and parses only
the files whose stamp changed. A scan runs when the catalogue is used and ``rescan`` seconds
have passed since the last one, or at once after this catalogue wrote something; in between,
the catalogue (and the rendered ``## Skills`` section) is served from memory in about a
microsecond. ``read_skill`` of a name it does not know rescans first, and bodies are always read
from disk, so a tool sees a hand edit at once; the system prompt within ``rescan`` seconds. A
large folder is never scanned on the event loop: see :meth:`SkillCatalogue.current`.

Thread-safe: the tools run the file work in threads; one lock guards the scan.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import difflib
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agentik_skills.format import (
    MAX_BODY_CHARS,
    MAX_FILE_BYTES,
    SKILL_MD,
    YAML_SUFFIXES,
    Skill,
    SkillError,
    clean_description,
    decode,
    name_parts,
    parse_yaml_skill,
    render_skill_md,
    render_yaml_skill,
    skill_from_fields,
    split_skill_md,
)

log = logging.getLogger("agentik.skills")

ARCHIVE = ".archive"  # hidden: never scanned
MAX_RESOURCE_BYTES = 100_000  # read_skill_file shows at most this much of a file
MAX_LISTED_FILES = 200
MAX_PATH_CHARS = 1024
#: a folder with more skill files than this is never checked on the event loop (a check
#: costs about 2 system calls per skill): a prompt built on the loop starts it in a thread
LOOP_SCAN_FILES = 200
SECTION_HEAD = (
    "## Skills\n\n"
    "Skills are instructions for particular tasks. When one fits the task at hand, call "
    "read_skill with its name first and follow it.\n"
)

Stamp = tuple[int, int, int]  # mtime_ns, size, inode (of the target, for a symlink)


@dataclass(frozen=True, slots=True)
class Skipped:
    """A file the catalogue left out: broken, or a duplicate name."""

    path: str  # relative to the skills folder
    reason: str


@dataclass(frozen=True, slots=True)
class _Candidate:
    path: str  # relative, posix
    stamp: Stamp
    link: bool  # a symlink: it must resolve inside the folder


class SkillCatalogue:
    """The skills of one folder. ``rescan``: seconds between checks of the folder for changes
    made by others (0: check at every use)."""

    def __init__(self, root: Path, rescan: float = 1.0) -> None:
        self.root = Path(os.path.abspath(root.expanduser()))
        self.rescan = rescan
        self._lock = threading.Lock()
        self._candidates: list[_Candidate] | None = None
        self._parsed: dict[str, tuple[Stamp, Skill | SkillError]] = {}
        self._skills: dict[str, Skill] = {}
        self._skipped: list[Skipped] = []
        self._reported: set[Skipped] = set()
        self._section: str | None = None
        self._checked = -float("inf")  # time.monotonic() of the last scan
        self._background: asyncio.Future[None] | None = None  # a check running in a thread
        self._dirty = True
        #: bumped each time the catalogue's content changes (for caches built on it)
        self.version = 0

    # --- reading the catalogue ---------------------------------------------------------------

    def skills(self) -> list[Skill]:
        """Every skill, in path order."""
        self.current()
        return list(self._skills.values())

    def get(self, name: str) -> Skill | None:
        self.current()
        return self._skills.get(name)

    def skipped(self) -> list[Skipped]:
        """The broken files and duplicates of the last scan."""
        self.current()
        return list(self._skipped)

    def prompt_section(self) -> str | None:
        """The ``## Skills`` section: one ``- **name**: description`` line per skill."""
        self.current()
        return self._section

    def current(self, force: bool = False) -> None:
        """Rescan if this catalogue wrote, ``force``, or ``rescan`` seconds passed.

        On the event loop, the check of a folder of more than :data:`LOOP_SCAN_FILES` files
        is started in a thread instead, and the caller goes on with what the catalogue knew."""
        if not (force or self._dirty or time.monotonic() - self._checked >= self.rescan):
            return
        large = self._candidates is not None and len(self._candidates) > LOOP_SCAN_FILES
        if not force and large and _on_event_loop():
            if self._background is None or self._background.done():
                self._background = asyncio.get_running_loop().run_in_executor(None, self._check)
                self._background.add_done_callback(_log_failure)
            return
        self._check()

    def _check(self) -> None:
        with self._lock:
            self._dirty = False  # before the scan: a write during it marks it again
            self._refresh()
            self._checked = time.monotonic()

    def invalidate(self) -> None:
        self._dirty = True

    # --- scanning ----------------------------------------------------------------------------

    def _scan(self) -> list[_Candidate]:
        """SKILL.md files anywhere and YAML files outside skill folders (inside one they are the
        skill's resources), in path order. Hidden entries and symlinked folders are skipped."""
        found: list[_Candidate] = []

        def walk(folder: str, rel: str, in_skill: bool) -> None:
            try:
                with os.scandir(folder) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError:
                return
            in_skill = in_skill or any(e.name == SKILL_MD for e in entries)
            for e in entries:
                if e.name.startswith("."):
                    continue
                try:
                    if e.is_dir(follow_symlinks=False):
                        walk(e.path, f"{rel}{e.name}/", in_skill)
                        continue
                    wanted = e.name == SKILL_MD or (not in_skill and e.name.endswith(YAML_SUFFIXES))
                    if not wanted:
                        continue
                    link = e.is_symlink()
                    st = e.stat()
                    stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
                except OSError:
                    link, stamp = False, (0, -1, 0)  # a dangling symlink or a vanished file
                found.append(_Candidate(f"{rel}{e.name}", stamp, link))

        walk(str(self.root), "", False)
        return found

    def _refresh(self) -> None:
        candidates = self._scan()
        if candidates == self._candidates:
            return
        parsed: dict[str, tuple[Stamp, Skill | SkillError]] = {}
        skills: dict[str, Skill] = {}
        skipped: list[Skipped] = []
        for c in candidates:
            cached = self._parsed.get(c.path)
            if cached is None or cached[0] != c.stamp:
                cached = (c.stamp, self._parse(c))
            parsed[c.path] = cached
            result = cached[1]
            if isinstance(result, SkillError):
                skipped.append(Skipped(c.path, str(result)))
            elif result.name in skills:
                first = skills[result.name].path
                skipped.append(Skipped(c.path, f"duplicate name {result.name!r} (kept {first})"))
            else:
                skills[result.name] = result
        for s in skipped:
            if s not in self._reported:
                log.warning("skill file %s skipped: %s", self.root / s.path, s.reason)
        self._reported = set(skipped)
        self._candidates, self._parsed = candidates, parsed
        self._skills, self._skipped = skills, skipped
        lines = [f"- **{s.name}**: {s.description}" for s in skills.values()]
        self._section = SECTION_HEAD + "\n" + "\n".join(lines) if lines else None
        self.version += 1

    def _parse(self, c: _Candidate) -> Skill | SkillError:
        try:
            if c.stamp[1] < 0:
                raise SkillError("cannot be read (a dangling symlink?)")
            path = self.root / c.path
            if c.link:
                self._inside(path)
            with open(path, "rb") as f:
                text = decode(f.read(MAX_FILE_BYTES + 1))
            return self._skill_from_text(c.path, text)
        except SkillError as e:
            return e
        except OSError as e:
            return SkillError(f"cannot be read: {e.strerror}")

    def _skill_from_text(self, rel: str, text: str) -> Skill:
        if rel.endswith(YAML_SUFFIXES):
            fields, _ = parse_yaml_skill(text)
            declared = fields.get("name")
            if declared is None:
                raise SkillError("missing name")
            name_parts(declared)
            return skill_from_fields(declared, fields, rel)
        folders = rel.split("/")[:-1]
        if not folders:
            raise SkillError("a SKILL.md must sit in a folder named like the skill")
        name = ":".join(folders)
        try:
            name_parts(name)
        except SkillError as e:
            raise SkillError(f"its folder is not a skill name: {e}") from None
        fields, _ = split_skill_md(text)
        declared = fields.get("name")
        if declared is None:
            raise SkillError("missing name")
        if declared not in (folders[-1], name):
            name_parts(declared)  # a better message when the name itself is invalid
            raise SkillError(f"its name {declared!r} does not match its folder {folders[-1]!r}")
        return skill_from_fields(name, fields, rel)

    # --- paths that never leave the folder ---------------------------------------------------

    def _inside(self, path: Path, within: Path | None = None) -> Path:
        """``path`` with symlinks resolved, or :class:`SkillError` when that leaves ``within``
        (default: the skills folder)."""
        base = (within or self.root).resolve()
        resolved = path.resolve()
        if not resolved.is_relative_to(base):
            raise SkillError("that path leads outside the skills folder (a symlink?)")
        return resolved

    def _known(self, name: Any) -> Skill:
        name_parts(name)
        skill = self.get(name)
        if skill is None:  # created by hand since the last scan?
            self.current(force=True)
            skill = self._skills.get(name)
        if skill is None:
            close = difflib.get_close_matches(name, list(self._skills), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise SkillError(f"no skill named {name!r}{hint}")
        return skill

    def _folder(self, skill: Skill) -> Path:
        if skill.is_yaml:
            raise SkillError(f"{skill.name!r} is a YAML skill: it has no folder of its own")
        return self._inside((self.root / skill.path).parent)

    # --- the tools' operations (blocking: run them in a thread) -----------------------------

    def read(self, name: str) -> tuple[Skill, str, list[str]]:
        """A skill, its body and the other files of its folder (relative paths)."""
        skill = self._known(name)
        path = self._inside(self.root / skill.path)
        try:
            with open(path, "rb") as f:
                text = decode(f.read(MAX_FILE_BYTES + 1))
        except OSError as e:
            self.invalidate()
            raise SkillError(f"skill {name!r} cannot be read: {e.strerror}") from None
        if skill.is_yaml:
            return skill, parse_yaml_skill(text)[1], []
        return skill, split_skill_md(text)[1], self._files(self._folder(skill))

    def _files(self, folder: Path) -> list[str]:
        """The files of a skill's folder but its SKILL.md, hidden files and nested skills."""
        out: list[str] = []

        def walk(current: Path, rel: str) -> None:
            try:
                with os.scandir(current) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError:
                return
            for e in entries:
                if len(out) >= MAX_LISTED_FILES or e.name.startswith("."):
                    continue
                if e.is_dir(follow_symlinks=False):
                    if not os.path.exists(os.path.join(e.path, SKILL_MD)):
                        walk(Path(e.path), f"{rel}{e.name}/")
                elif rel or e.name != SKILL_MD:
                    out.append(f"{rel}{e.name}")

        walk(folder, "")
        return out

    def read_file(self, name: str, path: Any) -> str:
        """A text file of a skill's folder, at most :data:`MAX_RESOURCE_BYTES` of it."""
        skill = self._known(name)
        folder = self._folder(skill)
        rel = _relative_path(path)
        target = self._inside(folder / rel, within=folder)
        if not target.is_file():
            raise SkillError(f"skill {name!r} has no file {rel!r}")
        try:
            with open(target, "rb") as f:
                raw = f.read(MAX_RESOURCE_BYTES + 1)
                size = os.fstat(f.fileno()).st_size
        except OSError as e:
            raise SkillError(f"{rel!r} cannot be read: {e.strerror}") from None
        cut = len(raw) > MAX_RESOURCE_BYTES
        raw = raw[:MAX_RESOURCE_BYTES]
        try:
            if b"\0" in raw:
                raise UnicodeDecodeError("utf-8", raw, 0, 1, "NUL byte")
            text = codecs.getincrementaldecoder("utf-8")().decode(raw, final=not cut)
        except UnicodeDecodeError:
            raise SkillError(f"{rel!r} is not a text file") from None
        if cut:
            text += f"\n[… cut: {size} bytes, only the first {MAX_RESOURCE_BYTES} shown]"
        return text

    def save(self, name: str, description: str, body: str) -> tuple[Skill, bool]:
        """Create or update a skill; returns it and whether it was created. A ``SKILL.md`` goes
        to ``a/b/c/SKILL.md`` for ``a:b:c``; an existing YAML skill is updated in its file."""
        parts = name_parts(name)
        description = clean_description(description)
        if not isinstance(body, str):
            raise SkillError("the body must be a string")
        if len(body) > MAX_BODY_CHARS:
            raise SkillError(f"the body is longer than {MAX_BODY_CHARS} characters")
        existing = self.get(name)
        if existing is not None and existing.is_yaml:
            path = self._inside(self.root / existing.path)
            fields, _ = parse_yaml_skill(decode(path.read_bytes()))
            fields.update(description=description, body=body.strip())
            text = render_yaml_skill(fields)
            self._skill_from_text(existing.path, text)  # what is written loads back
        else:
            folder = self._inside(self.root.joinpath(*parts))
            path = folder / SKILL_MD
            fields = {}
            if path.is_symlink() or path.exists():
                self._inside(path)  # never write over a link that points out
                with contextlib.suppress(SkillError, OSError):
                    fields = split_skill_md(decode(path.read_bytes()))[0]
            fields.update(name=parts[-1], description=description)
            text = render_skill_md(fields, body)
            self._skill_from_text("/".join([*parts, SKILL_MD]), text)
            self.root.mkdir(parents=True, exist_ok=True)
            folder.mkdir(parents=True, exist_ok=True)
            self._inside(folder)  # a folder swapped for a symlink meanwhile
        atomic_write(path, text)
        self.invalidate()
        saved = self.get(name)
        if saved is None:  # another file claims the name first (a duplicate earlier by path)
            raise SkillError(f"saved {path.relative_to(self.root)}, but {name!r} is taken")
        return saved, existing is None

    def delete(self, name: str) -> str:
        """Move a skill to the archive; returns where it went (relative to the folder).

        A SKILL.md skill moves with its whole folder; one holding nested skills is refused.
        Restore it by moving it back (see docs/skills.md)."""
        skill = self._known(name)
        if skill.is_yaml:
            source = self._inside(self.root / skill.path)
            rel = skill.path
        else:
            source = self._folder(skill)
            rel = skill.path.rsplit("/", 1)[0]
            nested = [s.name for s in self._skills.values() if s.path.startswith(rel + "/")]
            nested = [n for n in nested if n != name]
            if nested:
                raise SkillError(
                    f"{name!r} holds nested skills ({', '.join(nested)}): delete them first"
                )
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        target = self.root / ARCHIVE / f"{rel}@{stamp}"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(source, target)
        self.current(force=True)  # here, in the tool's thread: the next prompt sees it
        return f"{ARCHIVE}/{rel}@{stamp}"


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _log_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("checking the skills folder failed", exc_info=future.exception())


def _relative_path(path: Any) -> str:
    """A path inside a skill's folder as given by the model, or :class:`SkillError`."""
    if not isinstance(path, str) or not path.strip():
        raise SkillError("the path must be a non-empty string")
    if len(path) > MAX_PATH_CHARS:
        raise SkillError("the path is too long")
    if "\0" in path or "\\" in path:
        raise SkillError("the path must not contain NUL or backslashes")
    if path.startswith("/") or (len(path) > 1 and path[1] == ":"):
        raise SkillError("the path must be relative to the skill's folder")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise SkillError("the path must not contain '..'")
    if not parts:
        raise SkillError("the path names no file")
    return "/".join(parts)


def atomic_write(path: Path, text: str) -> None:
    """Write a file so that readers see the old or the new content, never a mix: a hidden
    temporary file beside it, flushed to disk, then renamed over it."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    with contextlib.suppress(OSError):  # the rename itself durable (not on every platform)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
