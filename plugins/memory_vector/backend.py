"""The ``vector`` memory backend: notes and their vectors in the agent's database, found by
meaning through an hnswlib index (``index.py``).

The database (SQLite's ``AGENTIK_DB_PATH`` or ``AGENTIK_DATABASE_URL``'s PostgreSQL, tables
``memory_vector_note`` and ``memory_vector_meta``) is the truth; the index is a cache of its
vectors. With many instances on one PostgreSQL each keeps its own index, caught up from the
database: a change is announced on the ``memory`` channel (``store.shared().notify``: the row's
label, ``-label`` for a removal) and every instance applies it to its index.

Search asks the index for candidates, drops the ones the database no longer holds live (a
crash, or another instance, may leave a deleted note in an index), and re-ranks them by exact
cosine with a recency weight (:func:`score`). Writes (save, delete, archive) and index changes
happen under one lock: a note is in the index only once committed, and out of it as soon as
its deletion is.

Embeddings come from ``agent.embedding`` through :class:`Embedder`: an LRU cache (the prefetch
and the review embed the same text more than once per turn) and batching (texts asked in the
same loop iteration go in one call; backends run off the event loop).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy
import peewee

from agentik.core.embedding import EmbeddingBackend, EmbeddingError
from agentik.core.memory import MemoryBackend, Note, NoteError, check_category
from agentik.core.models import for_agent
from agentik.core.plugins import StartupError
from agentik_memory_vector.index import AnnIndex

if TYPE_CHECKING:
    from agentik.core.db import Database
    from agentik.core.store import Store
    from agentik.core.store.base import SharedStore

log = logging.getLogger("agentik.memory")

#: the recency weight: a note's cosine counts in full when it was created or last used just
#: now, and loses up to RECENCY (10 %) of it as that moment ages, half of that every
#: HALF_LIFE (30 days): an older note ranks below a fresh one only when they are near equal
RECENCY, HALF_LIFE_DAYS = 0.1, 30.0
#: the store's notification channel of the notes' changes (many instances on one database)
CHANNEL = "memory"
#: notes with a lower cosine to the query share nothing meaningful with it: not returned
MIN_COSINE = 0.15
CANDIDATES = 4  # index candidates per note asked for (at least 40), re-ranked exactly


class VectorNote(peewee.Model):
    id = peewee.AutoField()  # the index label
    note_id = peewee.TextField(unique=True)
    category = peewee.TextField()
    text = peewee.TextField()
    source = peewee.TextField()
    created = peewee.TextField()  # ISO 8601, UTC
    last_used = peewee.TextField(null=True)
    uses = peewee.IntegerField(default=0)
    vector = peewee.BlobField()  # float32, unit length
    #: None while live; why it was archived ("deleted", "stale"), kept to restore it by hand
    archived = peewee.TextField(null=True)
    archived_at = peewee.TextField(null=True)

    class Meta:
        table_name = "memory_vector_note"
        indexes = ((("archived", "category"), False),)


class VectorMeta(peewee.Model):
    key = peewee.TextField(primary_key=True)
    value = peewee.TextField()

    class Meta:
        table_name = "memory_vector_meta"


class Row(NamedTuple):
    """A note's row as the search reads it (its vector stays in the database)."""

    id: int
    note_id: str
    category: str
    text: str
    source: str
    created: str
    last_used: str | None
    uses: int
    archived: str | None


def models() -> tuple[type[VectorNote], type[VectorMeta]]:
    """This agent's subclasses of the two tables (:func:`agentik.core.models.for_agent`)."""
    return cast(tuple[type[VectorNote], type[VectorMeta]], for_agent(VectorNote, VectorMeta))


def unit(vectors: numpy.ndarray) -> numpy.ndarray:
    norms = numpy.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / numpy.where(norms == 0, 1, norms)).astype(numpy.float32)


def score(cosine: float, age: timedelta) -> float:
    """``cosine * (1 - R + R * 2 ** (-age / H))``, R = 0.1, H = 30 days, in [0, 1]."""
    days = max(age.total_seconds(), 0.0) / 86400
    return max(0.0, min(1.0, cosine * (1 - RECENCY + RECENCY * 0.5 ** (days / HALF_LIFE_DAYS))))


def _iso(dt: datetime) -> str:
    return dt.isoformat(timespec="seconds")


def _time(raw: str | None) -> datetime | None:
    return None if raw is None else datetime.fromisoformat(raw)


class Embedder:
    """One embedding backend, asked once for all the texts asked in the same loop iteration
    (a review's facts, saves at once). Caching repeated texts is the backend's (``http`` keeps
    an LRU of 256)."""

    def __init__(self, backend: EmbeddingBackend) -> None:
        self.backend = backend
        self._pending: dict[str, asyncio.Future[numpy.ndarray]] = {}
        self._flushes: set[asyncio.Task[None]] = set()

    async def one(self, text: str) -> numpy.ndarray:
        """``text``'s unit vector; raises :class:`EmbeddingError`."""
        future = self._pending.get(text)
        if future is None:
            if not self._pending:  # the first text of this iteration: flush after it
                flush = asyncio.create_task(self._embed_pending())
                self._flushes.add(flush)
                flush.add_done_callback(self._flushes.discard)
            future = self._pending[text] = asyncio.get_running_loop().create_future()
            future.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved
        return await asyncio.shield(future)

    async def _embed_pending(self) -> None:
        pending: dict[str, asyncio.Future[numpy.ndarray]] = {}
        try:
            await asyncio.sleep(0)  # the texts asked in this loop iteration go together
            pending, self._pending = self._pending, {}
            texts = list(pending)
            vectors = unit(numpy.asarray(await self.backend.embed(texts), dtype=numpy.float32))
            if vectors.shape != (len(texts), self.backend.dimension):
                raise EmbeddingError(
                    f"the embedding backend answered shape {vectors.shape} for {len(texts)} "
                    f"texts of dimension {self.backend.dimension}"
                )
        except BaseException as e:
            if not pending:  # cancelled before it took the texts: whoever asked is told
                pending, self._pending = self._pending, {}
            error = e if isinstance(e, EmbeddingError) else EmbeddingError(repr(e))
            for future in pending.values():
                if not future.done():
                    future.set_exception(error)
            if not isinstance(e, Exception):
                raise
            return
        for text, vector in zip(texts, vectors, strict=True):
            if not pending[text].done():
                pending[text].set_result(vector)

    async def close(self) -> None:
        """Stop the calls under way (their callers get an error) before the backend closes."""
        flushes = list(self._flushes)
        for flush in flushes:
            flush.cancel()
        await asyncio.gather(*flushes, return_exceptions=True)


class VectorMemory(MemoryBackend):
    def __init__(self, store: Store, embedding: EmbeddingBackend, index_path: Path | None) -> None:
        self.store = store
        self.embedding = embedding
        self.embedder = Embedder(embedding)
        self._row_sql: dict[int, str] = {}  # the search's SQL by number of candidates
        self.index_path = index_path
        self.Note, self.Meta = models()
        self._db: Database | None = None
        self._index: AnnIndex | None = None
        self._lock = asyncio.Lock()  # writes and index changes, one at a time
        self._count = 0
        self._catching_up: set[asyncio.Task[None]] = set()
        self._shared: SharedStore | None = None  # the instances sharing the store, if any

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        db = await self.store.add_models([self.Note, self.Meta])
        if db is None:
            raise NoteError("the vector memory needs the agent's database (AGENTIK_DB_PATH)")
        self._db = db
        dimension = self.embedding.dimension
        await self._check_dimension(db, dimension)
        index = AnnIndex(dimension, self.index_path)
        rows = await db.read(lambda: [r for (r,) in self._live().select(self.Note.id).tuples()])
        self._count = len(rows)
        loaded = await asyncio.to_thread(index.load)
        if not loaded or index.deleted > max(len(rows), 1000):  # too many holes: rebuild
            started = asyncio.get_running_loop().time()
            vectors = await db.read(lambda: self._vectors(rows))
            await asyncio.to_thread(index.rebuild, rows, vectors)
            took = asyncio.get_running_loop().time() - started
            if self.index_path is not None:
                log.info("memory index rebuilt: %d notes in %.2f s", len(rows), took)
        else:
            # notes committed after the index was saved, or deleted since (a crash)
            missing, dropped = index.reconcile(rows)
            if missing:
                vectors = await db.read(lambda: self._vectors(missing))
                await asyncio.to_thread(index.add, missing, vectors, -1)
            if missing or dropped:
                log.info("memory index caught up: %d notes added, %d dropped",
                         len(missing), dropped)  # fmt: skip
        if index.dirty:
            await asyncio.to_thread(index.save)
        self._index = index
        # other instances on this database: their changes reach this index (none on SQLite)
        self._shared = self.store.shared()
        if self._shared is not None:
            await self._shared.listen(CHANNEL, self._heard, self._missed)

    # --- other instances' changes (many instances on one database) ------------------------

    def _heard(self, payload: str) -> None:
        added = [int(p) for p in payload.split(",") if p.isdigit()]
        removed = [int(p[1:]) for p in payload.split(",") if p.startswith("-") and p[1:].isdigit()]
        self._later(self._apply(added, removed))

    def _missed(self) -> None:
        """The notifications' connection came back: what it missed is read from the table."""
        self._later(self._reconcile())

    def _later(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._catching_up.add(task)
        task.add_done_callback(self._catching_up.discard)

    async def _apply(self, added: list[int], removed: list[int]) -> None:
        async with self._lock:
            index, db = self._index, self._db
            if index is None or db is None:
                return
            for label in removed:
                if label in index.labels:
                    index.remove(label)
                    self._count -= 1
            new = [label for label in added if label not in index.labels]  # not its own
            if not new:
                return
            query = self._live().select(self.Note.id).where(self.Note.id.in_(new))
            live = await db.read(lambda: [r for (r,) in query.tuples()])
            if live:
                vectors = await db.read(lambda: self._vectors(live))
                await asyncio.to_thread(index.add, live, vectors)
                self._count += len(live)

    async def _reconcile(self) -> None:
        async with self._lock:
            index, db = self._index, self._db
            if index is None or db is None:
                return
            rows = await db.read(lambda: [r for (r,) in self._live().select(self.Note.id).tuples()])
            missing, _ = index.reconcile(rows)
            if missing:
                vectors = await db.read(lambda: self._vectors(missing))
                await asyncio.to_thread(index.add, missing, vectors)
            self._count = len(rows)

    async def _announce(self, change: str) -> None:
        if self._shared is None:
            return
        try:
            await self._shared.notify(CHANNEL, change)
        except Exception as e:  # the note is stored: others find it at their next catch-up
            log.warning("memory: other instances not told of %s: %s", change, e)

    async def _check_dimension(self, db: Database, dimension: int) -> None:
        """The vectors stored have this backend's dimension, or start-up stops (never mixed)."""
        meta = await db.read(lambda: dict(self.Meta.select().tuples()))
        stored = int(meta.get("dimension", 0))
        model = f"{self.embedding.name} {self.embedding.model}".strip()
        count = await db.read(lambda: self.Note.select().count())
        if count and stored and stored != dimension:
            # the variables of the backend in use, never another backend's
            chosen_by = ", ".join(self.embedding.model_settings) or (
                f"the settings of the {self.embedding.name!r} embedding backend, see "
                "`agentik plugins`"
            )
            raise StartupError(
                f"AGENTIK_EMBEDDING_BACKEND={self.embedding.name!r}: the vector memory in "
                f"{self.store_path} holds {count} notes of dimension {stored} (embedded by "
                f"{meta.get('embedding', '?')}), but {model} gives {dimension}; use that "
                f"embedding model again ({chosen_by}) or another AGENTIK_DB_PATH"
            )
        if count and meta.get("embedding") not in (None, model):
            log.warning("memory notes were embedded by %s, now by %s: search quality may suffer",
                        meta.get("embedding"), model)  # fmt: skip

        def write() -> None:
            for key, value in (("dimension", str(dimension)), ("embedding", model)):
                # an upsert both databases know (SQLite's REPLACE is not PostgreSQL's)
                self.Meta.insert(key=key, value=value).on_conflict(
                    conflict_target=[self.Meta.key], update={self.Meta.value: value}
                ).execute()

        if not count or meta.get("dimension") != str(dimension):
            await db.write(write)

    @property
    def store_path(self) -> str:
        return self._db.path if self._db is not None else "?"

    async def close(self) -> None:
        await self.embedder.close()
        for task in list(self._catching_up):
            task.cancel()
        async with self._lock:
            index, self._index = self._index, None
            if index is not None and index.dirty:
                try:
                    await asyncio.to_thread(index.save)
                except OSError as e:  # rebuilt or caught up at the next start
                    log.warning("memory index %s not saved: %s", index.path, e)

    def describe(self) -> str:
        return (
            f"{self._count} notes, dim {self.embedding.dimension}, embeddings: "
            f"{self.embedding.name} {self.embedding.model}".rstrip()
        )

    # --- queries --------------------------------------------------------------------------

    def _live(self) -> peewee.ModelSelect:
        return self.Note.select().where(self.Note.archived.is_null())

    def _vectors(self, labels: Sequence[int]) -> numpy.ndarray:
        """The stored vectors of these rows, in order (read in chunks: SQL parameter limits)."""
        out = numpy.empty((len(labels), self.embedding.dimension), dtype=numpy.float32)
        at = {label: i for i, label in enumerate(labels)}
        for start in range(0, len(labels), 500):
            chunk = labels[start : start + 500]
            query = self.Note.select(self.Note.id, self.Note.vector).where(self.Note.id.in_(chunk))
            for label, blob in query.tuples():
                out[at[label]] = numpy.frombuffer(blob, dtype=numpy.float32)
        return out

    def _rows(self, labels: Sequence[int]) -> list[Row]:
        """The rows of these labels by primary key, without their vectors. The SQL is peewee's
        for the bound database (portable), built once per number of labels: building it costs
        more than SQLite takes to answer it."""
        sql = self._row_sql.get(len(labels))
        if sql is None:
            fields = [getattr(self.Note, name) for name in Row._fields]
            query = self.Note.select(*fields).where(self.Note.id.in_(list(labels)))
            sql = self._row_sql[len(labels)] = query.sql()[0]
        cursor = self.Note._meta.database.execute_sql(sql, list(labels))
        return [Row(*r) for r in cursor.fetchall()]

    def _note(self, row: Any, relevance: float | None = None) -> Note:
        return Note(
            row.note_id,
            row.category,
            row.text,
            row.source,
            datetime.fromisoformat(row.created),
            _time(row.last_used),
            row.uses,
            relevance,
        )

    def _db_(self) -> Database:
        if self._db is None or self._index is None:
            raise NoteError("the memory is closed")
        return self._db

    async def _embed(self, text: str) -> numpy.ndarray:
        try:
            return await self.embedder.one(text)
        except EmbeddingError as e:
            raise NoteError(f"memory search failed: {e}") from e

    async def save(self, category: str, text: str, source: str) -> Note:
        check_category(category)
        text = text.strip()
        if not text:
            raise NoteError("a note needs text")
        try:
            vector = await self.embedder.one(text)
        except EmbeddingError as e:
            raise NoteError(f"the note was not saved: {e}") from e
        db = self._db_()
        now = datetime.now(UTC).replace(microsecond=0)
        note = Note(uuid.uuid4().hex[:12], category, text, source, now)
        async with self._lock:
            index = self._index
            if index is None:
                raise NoteError("the memory is closed")
            row = await db.write(
                lambda: self.Note.create(
                    note_id=note.id,
                    category=category,
                    text=text,
                    source=source,
                    created=_iso(now),
                    vector=vector.tobytes(),
                )
            )
            self._count += 1
            # committed: a crash from here on leaves the note to the next start's catch-up
            await asyncio.to_thread(index.add, [row.id], vector[None, :])
        await self._announce(str(row.id))
        return note

    async def search(self, query: str, limit: int) -> list[Note]:
        if limit <= 0 or not query.strip():
            return []
        db = self._db_()
        vector = await self._embed(query)
        async with self._lock:
            if self._index is None:
                raise NoteError("the memory is closed")
            found = self._index.query(vector, max(limit * CANDIDATES, 40))
            cosines = {label: cosine for label, cosine in found if cosine >= MIN_COSINE}
            if not cosines:
                return []
            rows = await db.read(lambda: self._rows(list(cosines)))
        # only what is live now: never a deleted note from a stale index
        live = sorted((r for r in rows if r.archived is None), key=lambda r: -cosines[r.id])
        if not live:
            return []
        # the recency weight takes at most RECENCY of a cosine: a note below (1 - RECENCY) x the
        # limit-th best cosine cannot make the top, and is not weighed
        floor = (1 - RECENCY) * cosines[live[min(limit, len(live)) - 1].id]
        now = datetime.now(UTC)
        ranked = []
        for row in live:
            cosine = cosines[row.id]
            if cosine < floor:
                break
            created, used = datetime.fromisoformat(row.created), _time(row.last_used)
            moment = created if used is None else max(created, used)
            ranked.append((score(cosine, now - moment), row))
        ranked.sort(key=lambda pair: -pair[0])
        return [self._note(row, s) for s, row in ranked[:limit]]

    async def get(self, note_id: str) -> Note | None:
        db = self._db_()
        row = await db.read(lambda: self._live().where(self.Note.note_id == note_id).first())
        return None if row is None else self._note(row)

    async def list(self, category: str, offset: int = 0, limit: int = 50) -> list[Note]:
        check_category(category)
        db = self._db_()
        rows = await db.read(
            lambda: list(
                self._live()
                .where(self.Note.category == category)
                .order_by(self.Note.id)
                .offset(max(offset, 0))
                .limit(limit)
            )
        )
        return [self._note(r) for r in rows]

    async def delete(self, note_id: str, recoverable: bool = True) -> bool:
        db = self._db_()
        async with self._lock:
            row = await db.read(lambda: self._live().where(self.Note.note_id == note_id).first())
            if row is None:
                return False
            if recoverable:  # kept, archived: restore it by setting archived to NULL
                stamp = _iso(datetime.now(UTC))
                update = self.Note.update(archived="deleted", archived_at=stamp)
                await db.write(lambda: update.where(self.Note.id == row.id).execute())
            else:
                await db.write(lambda: self.Note.delete_by_id(row.id))
            self._count -= 1
            if self._index is not None:
                self._index.remove(row.id)
        await self._announce(f"-{row.id}")
        return True

    async def mark_used(self, note_ids: Sequence[str]) -> None:
        if not note_ids:
            return
        db = self._db_()
        stamp = _iso(datetime.now(UTC))
        update = self.Note.update(uses=self.Note.uses + 1, last_used=stamp).where(
            self.Note.note_id.in_(list(note_ids))
        )
        await db.write(update.execute)

    async def archive_stale(self, max_age: timedelta) -> int:
        db = self._db_()
        cutoff = _iso(datetime.now(UTC) - max_age)
        async with self._lock:
            stale = await db.read(
                lambda: [
                    r
                    for (r,) in self._live()
                    .select(self.Note.id)
                    .where((self.Note.uses == 0) & (self.Note.created <= cutoff))
                    .tuples()
                ]
            )
            if not stale:
                return 0
            stamp = _iso(datetime.now(UTC))

            def archive() -> None:
                for start in range(0, len(stale), 500):
                    chunk = stale[start : start + 500]
                    self.Note.update(archived="stale", archived_at=stamp).where(
                        self.Note.id.in_(chunk)
                    ).execute()

            await db.write(archive)
            self._count -= len(stale)
            if self._index is not None:
                for label in stale:
                    self._index.remove(label)
        for start in range(0, len(stale), 500):  # a notification's payload is capped (8000 B)
            await self._announce(",".join(f"-{label}" for label in stale[start : start + 500]))
        return len(stale)

    async def count(self) -> int:
        db = self._db_()
        return int(await db.read(lambda: self._live().count()))
