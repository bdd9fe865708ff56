"""The ``md`` memory backend: three Hermes-style files, searched through an FTS5 index.

The files (``user.md``, ``world.md``, ``preference.md``) are the source of truth. The backend
keeps them parsed in memory and indexed in ``.index.sqlite3`` beside them (its own cache: delete
it and it is rebuilt). Every operation first compares each file's size, mtime and inode with
what it last read, so a note edited, added or deleted by hand is seen by the next call; an
unchanged file costs one ``stat``. A search (each turn's prefetch) looks at most once every
:data:`RECHECK_EVERY` seconds: a hand edit is seen by the first search after that. Writes
rewrite the whole file into a temporary file and rename it over the old one (never torn by a
crash), one writer per file at a time.

Usage counters (``uses``, ``last_used``) change after every turn that was given notes: the
uses counted since the file last said them wait in memory and in the index's ``usage`` table,
and are written into the file the next time it is rewritten for a change of its notes. A
note's ``uses`` is what its header says plus what waits. The turn itself writes nothing: the
uses counted go to the index together at most :data:`FLUSH_EVERY` seconds later (and at
``close``), so a killed process loses at most that last interval's counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from agentik.core.memory import CATEGORIES, MemoryBackend, Note, NoteError, check_category
from agentik_memory_md import notefile, terms
from agentik_memory_md.notefile import Chunk

log = logging.getLogger(__name__)

INDEX = ".index.sqlite3"
#: seconds between two looks of a search at the files for hand edits
RECHECK_EVERY = 1.0
#: seconds the uses counted wait in memory before they are written to the index together
FLUSH_EVERY = 1.0
Signature = tuple[int, int, int] | None  # (mtime_ns, size, inode); None: no file


def signature(path: Path) -> Signature:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def write_atomic(path: Path, text: str) -> Signature:
    """Write ``text`` to a temporary file beside ``path``, flush it to disk, rename it over."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8", errors="surrogateescape", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return signature(path)


def read_text(path: Path) -> str:
    # surrogateescape: bytes that are not UTF-8 survive a rewrite unchanged
    return path.read_bytes().decode("utf-8", errors="surrogateescape")


@dataclass
class Edit:
    """What a change made of a file's chunks: all of them, the notes it added or replaced, and
    the notes it dropped."""

    chunks: list[Chunk]
    changed: list[Note] = field(default_factory=list)
    removed: list[Note] = field(default_factory=list)


def without(chunks: list[Chunk], drop: Callable[[Note], bool]) -> Edit | None:
    """The chunks but the notes ``drop`` picks (None: it picks none)."""
    kept = [c for c in chunks if c.note is None or not drop(c.note)]
    if len(kept) == len(chunks):
        return None
    return Edit(kept, removed=[c.note for c in chunks if c.note is not None and drop(c.note)])


@dataclass(frozen=True, slots=True)
class Usage:
    """Uses of a note counted since its file last said them, and the latest one."""

    uses: int
    last_used: datetime


def with_usage(note: Note, usage: Usage | None) -> Note:
    """``note`` as its file says it, plus the uses that wait in the index."""
    if usage is None:
        return note
    last = usage.last_used if note.last_used is None else max(note.last_used, usage.last_used)
    return Note(
        note.id, note.category, note.text, note.source, note.created, last, note.uses + usage.uses
    )


@dataclass
class NoteFile:
    category: str
    path: Path
    chunks: list[Chunk] = field(default_factory=list)
    signature: Signature = None
    problems: list[str] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one writer at a time

    @property
    def archive(self) -> Path:
        return self.path.with_name(f"{self.category}.archived.md")


class MdMemory(MemoryBackend):
    def __init__(self, folder: Path, recheck: float = RECHECK_EVERY) -> None:
        self.folder = folder
        self.recheck = recheck
        self._next_check = 0.0  # time.monotonic() of a search's next look at the files
        self.files = {c: NoteFile(c, folder / f"{c}.md") for c in CATEGORIES}
        self._db: sqlite3.Connection | None = None
        self._notes: dict[str, Note] = {}
        self._rowid: dict[str, int] = {}  # note id -> FTS rowid
        self._by_rowid: dict[int, str] = {}
        self._next_rowid = 1
        self._usage: dict[str, Usage] = {}  # note id -> uses not in its file yet
        self._unflushed: set[str] = set()  # ids whose usage changed in memory only
        self._flush_timer: asyncio.TimerHandle | None = None

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise NoteError(
                f"AGENTIK_MEMORY_DIR={str(self.folder)!r}: cannot create it: {e}"
            ) from e
        self._db = self._open_index()
        self._usage = {
            note_id: Usage(uses, notefile.parse_time(when))
            for note_id, uses, when in self._db.execute("SELECT id, uses, last_used FROM usage")
        }
        known = dict(self._db.execute("SELECT category, signature FROM files").fetchall())
        rows = self._db.execute("SELECT rowid, id FROM notes").fetchall()
        self._next_rowid = max((r for r, _ in rows), default=0) + 1
        indexed = {note_id: rowid for rowid, note_id in rows}
        rebuilt = False
        for f in self.files.values():
            self._load(f)
            ids = self._file_ids(f)
            if known.get(f.category) == repr(f.signature) and ids <= indexed.keys():
                for note in self._file_notes(f):  # the index holds this very file already
                    self._map(note.id, indexed[note.id])
                    self._notes[note.id] = with_usage(note, self._usage.get(note.id))
            else:
                self._reindex(f, drop=[indexed[i] for i in ids if i in indexed])
                rebuilt = True
        # rows of notes that are gone (a file replaced while the index was stale)
        stale = [(r,) for r, i in rows if i not in self._rowid]
        self._db.executemany("DELETE FROM notes WHERE rowid = ?", stale)
        gone = [(i,) for i in self._usage if i not in self._notes]  # deleted by hand
        self._db.executemany("DELETE FROM usage WHERE id = ?", gone)
        for (note_id,) in gone:
            del self._usage[note_id]
        self._db.commit()
        if rebuilt:
            self._reopen()

    def _reopen(self) -> None:
        """A new connection after indexing many notes: the one that wrote them answered FTS5
        queries 2-3 times slower than a fresh one (B11, 10k notes)."""
        assert self._db is not None
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._db.close()
        self._db = self._open_index()
        self._db.commit()

    def _open_index(self) -> sqlite3.Connection:
        path = self.folder / INDEX
        for attempt in (1, 2):
            db = sqlite3.connect(path, isolation_level=None)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=OFF")  # a cache: rebuilt from the files
                db.execute("BEGIN")
                db.execute(
                    "CREATE TABLE IF NOT EXISTS files (category TEXT PRIMARY KEY, signature TEXT)"
                )
                db.execute(
                    "CREATE VIRTUAL TABLE IF NOT EXISTS notes USING fts5("
                    "text, id UNINDEXED, tokenize = 'unicode61 remove_diacritics 2')"
                )
                db.execute(
                    "CREATE TABLE IF NOT EXISTS usage ("
                    "id TEXT PRIMARY KEY, uses INTEGER NOT NULL, last_used TEXT NOT NULL)"
                )
                db.execute("SELECT rowid, id FROM notes LIMIT 1").fetchall()
                return db
            except sqlite3.DatabaseError:
                db.close()
                if attempt == 2:
                    raise
                log.warning("memory index %s is unreadable; rebuilding it", path)
                for suffix in ("", "-wal", "-shm"):
                    with contextlib.suppress(FileNotFoundError):
                        Path(f"{path}{suffix}").unlink()
        raise AssertionError("unreachable")

    async def close(self) -> None:
        for f in self.files.values():  # let writes in progress finish
            async with f.lock:
                pass
        self._flush()
        if self._db is not None:
            self._db.close()
            self._db = None

    def describe(self) -> str:
        bad = sum(len(f.problems) for f in self.files.values())
        return f"{self.folder}, {len(self._notes)} notes" + (f", {bad} bad parts" if bad else "")

    @property
    def problems(self) -> list[str]:
        return [p for f in self.files.values() for p in f.problems]

    # --- reading the files ----------------------------------------------------------------

    def _load(self, f: NoteFile) -> None:
        """Parse ``f`` from disk into ``f.chunks`` (the index is the caller's business)."""
        sig = signature(f.path)
        if sig is None:
            f.chunks, f.problems = [], []
        else:
            text = read_text(f.path)
            when = datetime.fromtimestamp(sig[0] / 1e9, UTC)
            parsed = notefile.parse(text, f.category, when, f.path.name)
            f.chunks, f.problems = parsed.chunks, parsed.problems
            self._drop_duplicates(f)
            for problem in f.problems:
                log.warning("memory: %s (kept as it is, not used)", problem)
        f.signature = sig

    def _drop_duplicates(self, f: NoteFile) -> None:
        """A note whose id another file already uses is a bad part of this one."""
        others = {i for g in self.files.values() if g is not f for i in self._file_ids(g)}
        seen: set[str] = set()
        for n, chunk in enumerate(f.chunks):
            note = chunk.note
            if note is not None and (note.id in others or note.id in seen):
                f.problems.append(f"{f.path.name}: duplicate note id {note.id}")
                f.chunks[n] = Chunk(chunk.text)
            elif note is not None:
                seen.add(note.id)

    @staticmethod
    def _file_notes(f: NoteFile) -> list[Note]:
        return [c.note for c in f.chunks if c.note is not None]

    def _file_ids(self, f: NoteFile) -> set[str]:
        return {n.id for n in self._file_notes(f)}

    def _sync(self) -> None:
        """Reload the files changed on disk since they were read (hand edits)."""
        for f in self.files.values():
            if not f.lock.locked() and signature(f.path) != f.signature:
                self._reload(f)

    def _reload(self, f: NoteFile) -> None:
        old = [self._rowid[i] for i in self._file_ids(f) if i in self._rowid]
        for note_id in self._file_ids(f):
            self._unmap(note_id)
        self._load(f)
        self._reindex(f, drop=old)
        self._db_().commit()
        self._reopen()

    def _reindex(self, f: NoteFile, drop: Sequence[int]) -> None:
        db = self._db_()
        db.executemany("DELETE FROM notes WHERE rowid = ?", [(r,) for r in drop])
        for note in self._file_notes(f):
            self._insert(note)
        self._remember_signature(f)

    def _remember_signature(self, f: NoteFile) -> None:
        self._db_().execute(
            "INSERT OR REPLACE INTO files VALUES (?, ?)", (f.category, repr(f.signature))
        )

    def _db_(self) -> sqlite3.Connection:
        if self._db is None:
            raise NoteError("the memory is closed")
        if not self._db.in_transaction:
            self._db.execute("BEGIN")
        return self._db

    def _map(self, note_id: str, rowid: int) -> None:
        self._rowid[note_id] = rowid
        self._by_rowid[rowid] = note_id

    def _unmap(self, note_id: str) -> None:
        self._notes.pop(note_id, None)
        rowid = self._rowid.pop(note_id, None)
        if rowid is not None:
            self._by_rowid.pop(rowid, None)

    def _insert(self, note: Note) -> None:
        rowid = self._next_rowid
        self._next_rowid += 1
        self._db_().execute(
            "INSERT INTO notes (rowid, text, id) VALUES (?, ?, ?)",
            (rowid, terms.fold(note.text), note.id),
        )
        self._map(note.id, rowid)
        self._notes[note.id] = with_usage(note, self._usage.get(note.id))

    # --- writing ----------------------------------------------------------------------------

    async def _rewrite(
        self, f: NoteFile, change: Callable[[list[Chunk]], Edit | None], archive: str | None = None
    ) -> int:
        """Under the file's lock: reload hand edits, apply ``change`` to the chunks (None: no
        change), write the file atomically and update the index to match. Notes the change
        removed go to the archive file first when ``archive`` gives the reason (a crash in
        between leaves a note in both files, never in none). Returns how many were removed."""
        async with f.lock:
            if signature(f.path) != f.signature:
                self._reload(f)
            edit = change(f.chunks)
            if edit is None:
                return 0
            if archive and edit.removed:
                removed = [self._notes.get(n.id, n) for n in edit.removed]  # with their uses
                await asyncio.to_thread(self._append_archive, f, removed, archive)
            chunks, folded = self._fold_usage(edit.chunks)
            # rendering a big file takes milliseconds: off the event loop, with the write
            f.signature = await asyncio.to_thread(
                lambda: write_atomic(f.path, notefile.render(chunks))
            )
            f.chunks = chunks
            db = self._db_()
            for note in edit.removed:
                db.execute("DELETE FROM notes WHERE rowid = ?", (self._rowid[note.id],))
                self._unmap(note.id)
                if self._usage.pop(note.id, None) is not None:
                    db.execute("DELETE FROM usage WHERE id = ?", (note.id,))
            self._written(folded)
            for note in edit.changed:
                before = self._notes.get(note.id)
                if before is None:
                    self._insert(note)
                elif before.text != note.text:
                    db.execute(
                        "UPDATE notes SET text = ? WHERE rowid = ?",
                        (terms.fold(note.text), self._rowid[note.id]),
                    )
                self._notes[note.id] = with_usage(note, self._usage.get(note.id))
            self._remember_signature(f)
            db.commit()
            return len(edit.removed)

    def _fold_usage(self, chunks: list[Chunk]) -> tuple[list[Chunk], dict[str, Usage]]:
        """The chunks with the uses waiting in the index written into their headers, and what
        was folded in (forgotten by :meth:`_written` once the file is on disk)."""
        folded: dict[str, Usage] = {}
        out = chunks
        for n, c in enumerate(chunks):
            usage = None if c.note is None else self._usage.get(c.note.id)
            if c.note is not None and usage is not None:
                if out is chunks:
                    out = list(chunks)
                out[n] = notefile.note_chunk(with_usage(c.note, usage), c.extra)
                folded[c.note.id] = usage
        return out, folded

    def _written(self, folded: dict[str, Usage]) -> None:
        """The file now says the ``folded`` uses: drop them from the index (keeping any use
        counted while it was written)."""
        db = self._db_()
        for note_id, usage in folded.items():
            now = self._usage.get(note_id)
            if now is usage:
                del self._usage[note_id]
                db.execute("DELETE FROM usage WHERE id = ?", (note_id,))
            elif now is not None:
                left = self._usage[note_id] = Usage(now.uses - usage.uses, now.last_used)
                db.execute(
                    "INSERT OR REPLACE INTO usage VALUES (?, ?, ?)",
                    (note_id, left.uses, notefile.iso(left.last_used)),
                )

    @staticmethod
    def _append_archive(f: NoteFile, notes: list[Note], reason: str) -> None:
        """Append notes to the category's archive file (restore one by moving it back)."""
        now = notefile.iso(datetime.now(UTC))
        extra = {"archived": now, "reason": reason}
        moved = [notefile.note_chunk(n, extra) for n in notes]
        chunks = [Chunk(read_text(f.archive))] if f.archive.exists() else []
        for chunk in moved:
            chunks = notefile.append(chunks, chunk)
        write_atomic(f.archive, notefile.render(chunks))

    # --- the contract -----------------------------------------------------------------------

    async def save(self, category: str, text: str, source: str) -> Note:
        f = self.files[check_category(category)]
        text = text.strip()
        if not text:
            raise NoteError("a note needs text")
        now = datetime.now(UTC).replace(microsecond=0)  # as the file says it
        note = Note(uuid.uuid4().hex[:12], category, text, source, now)
        chunk = notefile.note_chunk(note)
        await self._rewrite(f, lambda chunks: Edit(notefile.append(chunks, chunk), [note]))
        return note

    async def search(self, query: str, limit: int) -> list[Note]:
        now = time.monotonic()
        if now >= self._next_check:  # not a stat of every file every turn
            self._next_check = now + self.recheck
            self._sync()
        wanted = terms.query_terms(query)
        if not wanted or limit <= 0:
            return []
        if self._db is None:
            raise NoteError("the memory is closed")
        rows = self._db.execute(
            "SELECT rowid, text FROM notes WHERE notes MATCH ? ORDER BY rank LIMIT ?",
            (terms.match_expression(wanted), limit),
        ).fetchall()
        notes, has = [], []
        for rowid, folded in rows:  # the index holds the folded text
            note = self._notes.get(self._by_rowid.get(rowid, ""))
            if note is not None:
                notes.append(note)
                has.append(terms.matched(wanted, folded))
        found = [
            # Note(...) directly: dataclasses.replace took a third of a search
            Note(n.id, n.category, n.text, n.source, n.created, n.last_used, n.uses, score)
            for n, score in zip(notes, terms.scores(wanted, has), strict=True)
            if score > 0
        ]
        found.sort(key=lambda n: -(n.score or 0.0))  # stable: bm25 order among equals
        return found

    async def get(self, note_id: str) -> Note | None:
        self._sync()
        return self._notes.get(note_id)

    async def list(self, category: str, offset: int = 0, limit: int = 50) -> list[Note]:
        self._sync()
        notes = self._file_notes(self.files[check_category(category)])
        page = notes[max(offset, 0) : max(offset, 0) + max(limit, 0)]
        return [self._notes.get(n.id, n) for n in page]

    async def delete(self, note_id: str, recoverable: bool = True) -> bool:
        self._sync()
        note = self._notes.get(note_id)
        if note is None:
            return False

        def change(chunks: list[Chunk]) -> Edit | None:
            return without(chunks, lambda n: n.id == note_id)

        reason = "deleted" if recoverable else None
        return await self._rewrite(self.files[note.category], change, reason) > 0

    async def mark_used(self, note_ids: Sequence[str]) -> None:
        """Count a use in memory; the index's ``usage`` table gets it with the others counted
        within :data:`FLUSH_EVERY` seconds (one write), the files at their next rewrite. No look
        at the files: a note edited away meanwhile keeps a count nothing reads (dropped at the
        next start)."""
        now = datetime.now(UTC).replace(microsecond=0)
        for note_id in dict.fromkeys(note_ids):
            note = self._notes.get(note_id)
            if note is None:
                continue
            before = self._usage.get(note_id)
            self._usage[note_id] = Usage((before.uses if before else 0) + 1, now)
            self._notes[note_id] = notefile.touched(note, now)
            self._unflushed.add(note_id)
        if self._unflushed and self._flush_timer is None:
            loop = asyncio.get_running_loop()
            self._flush_timer = loop.call_later(FLUSH_EVERY, self._flush)

    def _flush(self) -> None:
        """Write the uses counted since the last flush to the index. What a rewrite folded into
        its file (or a delete dropped) is no longer in ``_usage``: not written back."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        rows = [
            (note_id, usage.uses, notefile.iso(usage.last_used))
            for note_id in self._unflushed
            if (usage := self._usage.get(note_id)) is not None
        ]
        self._unflushed.clear()
        if rows and self._db is not None:
            try:
                db = self._db_()
                db.executemany("INSERT OR REPLACE INTO usage VALUES (?, ?, ?)", rows)
                db.commit()
            except sqlite3.Error as e:  # the counts stay in memory, and reach the files
                log.warning("memory: the uses counted could not be written to the index: %s", e)

    async def archive_stale(self, max_age: timedelta) -> int:
        self._sync()
        cutoff = datetime.now(UTC) - max_age

        def stale(n: Note) -> bool:
            n = self._notes.get(n.id, n)  # with the uses that wait in the index
            return n.uses == 0 and (n.last_used or n.created) <= cutoff

        def change(chunks: list[Chunk]) -> Edit | None:
            return without(chunks, stale)

        total = 0
        for f in self.files.values():
            if any(stale(n) for n in self._file_notes(f)) or signature(f.path) != f.signature:
                total += await self._rewrite(f, change, "stale")
        return total

    async def count(self) -> int:
        self._sync()
        return len(self._notes)
