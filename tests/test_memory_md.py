# ruff: noqa: RUF001 - Russian text
"""The md memory backend on real files: the format, hand edits, bad files, the FTS5 search
(English and Russian), archiving, atomic writes and concurrent writers."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from datetime import timedelta
from pathlib import Path

import pytest

from agentik.core.memory import Note, NoteError
from agentik_memory_md import backend as md
from agentik_memory_md import notefile
from agentik_memory_md.backend import MdMemory

#: how often the tests' memories look for hand edits on a search (the default is a second)
RECHECK = 0.02


@pytest.fixture
async def memory(tmp_path):
    memories: list[MdMemory] = []

    async def open_(folder: Path = tmp_path / "mem") -> MdMemory:
        m = MdMemory(folder, recheck=RECHECK)
        await m.start()
        memories.append(m)
        return m

    yield open_
    for m in memories:
        await m.close()


def notes_in(path: Path) -> list[Note]:
    parsed = notefile.parse(path.read_text(), path.stem, notefile.parse_time("2026-01-01"), "x")
    assert parsed.problems == []
    return [c.note for c in parsed.chunks if c.note is not None]


def later(path: Path) -> None:
    """Make sure a hand edit gets a new mtime even on coarse clocks, and that the next search
    looks at the files (at most every ``recheck`` seconds)."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))
    time.sleep(RECHECK)


async def test_a_saved_note_is_a_header_a_blank_line_and_the_body(memory, tmp_path):
    m = await memory()
    note = await m.save("user", "The user's name is Alice.", "USER")
    text = (tmp_path / "mem" / "user.md").read_text()
    header, blank, body, *_ = text.split("\n")
    assert header.startswith(f"§ id={note.id} created=") and "uses=0" in header
    assert "last_used=never" in header and header.endswith("source=USER")
    assert (blank, body) == ("", "The user's name is Alice.")
    assert await m.get(note.id) == note
    assert await m.list("user") == [note]
    assert (await m.search("what is my name", 5))[0].id == note.id
    assert await m.count() == 1 and "1 notes" in m.describe()
    with pytest.raises(NoteError, match="unknown category"):
        await m.save("secrets", "x", "USER")


async def test_a_body_that_looks_like_a_header_cannot_break_the_file(memory, tmp_path):
    m = await memory()
    tricky = "first line\n§ id=evil created=2020-01-01T00:00:00Z\n\\§ already escaped\n§"
    note = await m.save("world", tricky, "AGENT")
    await m.save("world", "a second note", "AGENT")
    raw = (tmp_path / "mem" / "world.md").read_text()
    assert "\n\\§ id=evil" in raw and "\n\\\\§ already escaped" in raw
    assert [n.text for n in notes_in(tmp_path / "mem" / "world.md")] == [tricky, "a second note"]
    m2 = await memory()  # and after a restart
    assert (await m2.get(note.id)).text == tricky and await m2.count() == 2


async def test_hand_edits_are_seen_by_the_next_search_without_a_restart(memory, tmp_path):
    m = await memory()
    note = await m.save("user", "The user lives in Berlin.", "USER")
    path = tmp_path / "mem" / "user.md"
    path.write_text(path.read_text().replace("Berlin", "Lisbon"))
    later(path)
    assert (await m.search("Lisbon", 5))[0].text == "The user lives in Lisbon."
    assert await m.search("Berlin", 5) == []
    # a note added by hand with a bare header gets an id derived from its text
    with path.open("a") as f:
        f.write("§\n\nThe user plays the cello.\n")
    later(path)
    found = await m.search("cello", 5)
    assert [n.text for n in found] == ["The user plays the cello."] and found[0].id.startswith("h")
    # deleted by hand
    path.write_text(path.read_text().split("§\n")[0])
    later(path)
    assert await m.search("cello", 5) == [] and await m.get(note.id) is not None
    # our next write keeps the hand edit
    await m.save("user", "The user has a cat.", "USER")
    assert [n.text for n in notes_in(path)] == ["The user lives in Lisbon.", "The user has a cat."]


async def test_an_unchanged_file_is_not_read_again(memory, monkeypatch):
    m = await memory()
    await m.save("user", "The user likes chess.", "USER")
    calls = []
    real = notefile.parse
    monkeypatch.setattr(md.notefile, "parse", lambda *a: calls.append(a) or real(*a))
    for _ in range(5):
        assert await m.search("chess", 5)
    assert calls == []


BAD_FILES = {
    "user.md": "no header here\n\n§ id=ok1 created=2026-01-01T00:00:00Z\n\nA good note.\n",
    "world.md": "§ id=x1 uses=many\n\nbad uses\n\n§ id=ok2\n\nAnother good note.\n\n§ not=",
    "preference.md": b"\x00\xff\xfe binary \x89PNG\r\n\x1a\n",
}


async def test_malformed_files_never_stop_start_up_and_stay_untouched(memory, tmp_path):
    folder = tmp_path / "mem"
    folder.mkdir()
    for name, content in BAD_FILES.items():
        data = content if isinstance(content, bytes) else content.encode()
        (folder / name).write_bytes(data)
    m = await memory()
    assert sorted(n.id for n in await m.search("good note", 5)) == ["ok1", "ok2"]
    problems = " | ".join(m.problems)
    assert "user.md line 1: text before the first note header" in problems
    assert "world.md line 1" in problems and "preference.md" in problems
    assert "bad parts" in m.describe()
    for name, content in BAD_FILES.items():
        data = content if isinstance(content, bytes) else content.encode()
        assert (folder / name).read_bytes() == data, name
    # writing into a file with bad parts keeps them byte for byte
    await m.save("preference", "Short answers.", "USER")
    await m.save("world", "A third note.", "USER")
    assert (folder / "preference.md").read_bytes().startswith(BAD_FILES["preference.md"])
    world = (folder / "world.md").read_text()  # a newline after the last bad part, then ours
    assert world.startswith(BAD_FILES["world.md"] + "\n§ id=")
    m2 = await memory()
    assert {n.text for n in await m2.list("world")} == {"Another good note.", "A third note."}


async def test_an_empty_file_and_a_missing_folder_are_fine(memory, tmp_path):
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "user.md").write_text("")
    assert await (await memory(tmp_path / "e")).count() == 0
    assert await (await memory(tmp_path / "new" / "deep")).count() == 0


async def test_a_folder_that_cannot_be_made_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(NoteError, match=r"AGENTIK_MEMORY_DIR='.*file/mem': cannot create it"):
        await MdMemory(tmp_path / "file" / "mem").start()


RUSSIAN = [
    ("user", "Пользователь живёт в Москве"),
    ("user", "Пользователя зовут Алексей"),
    ("preference", "Пользователь любит зелёный чай без сахара"),
    ("world", "Собака пользователя — лабрадор по кличке Рекс"),
    ("user", "Пользователь работает программистом в банке"),
]


@pytest.mark.parametrize(
    ("query", "want"),
    [
        ("Что нового в Москва?", 0),
        ("Расскажи о Москвой", 0),
        ("как меня зовут, Алексея помнишь?", 1),
        ("какой чай я люблю", 2),
        ("зеленого чая", 2),  # written without ё
        ("лабрадоры хорошие собаки?", 3),
        ("программисты в банках", 4),
        ("Рекса покормить", 3),
    ],
)
async def test_russian_word_forms_find_their_note(memory, query, want):
    m = await memory()
    ids = [(await m.save(c, t, "USER")).id for c, t in RUSSIAN]
    found = await m.search(query, 3)
    assert found and found[0].id == ids[want]
    assert 0 < found[0].score <= 1


async def test_english_forms_and_nothing_for_words_without_meaning(memory):
    m = await memory()
    daughter = await m.save("user", "The user's daughter is named Emma.", "USER")
    paris = await m.save("user", "The user lives in Paris near the river.", "USER")
    assert (await m.search("my daughters", 3))[0].id == daughter.id
    assert (await m.search("living in Paris", 3))[0].id == paris.id
    assert await m.search("what is this, is it the one?", 3) == []
    assert await m.search("", 3) == []
    # FTS5 syntax in the text is only words ("near" is one of the note's)
    assert [n.id for n in await m.search("'\"*( OR NEAR AND", 3)] == [paris.id]


async def test_the_index_survives_a_restart_and_is_rebuilt_when_broken(memory, tmp_path):
    m = await memory()
    note = await m.save("world", "Water boils at 100 degrees.", "AGENT")
    await m.close()
    index = tmp_path / "mem" / md.INDEX
    with sqlite3.connect(index) as db:
        assert db.execute("SELECT count(*) FROM notes").fetchone() == (1,)
    assert (await (await memory()).search("boils", 3))[0].id == note.id
    break_database(index)
    assert (await (await memory()).search("boils", 3))[0].id == note.id


def break_database(index: Path) -> None:
    index.write_bytes(b"this is not a database" * 100)
    for suffix in ("-wal", "-shm"):
        Path(f"{index}{suffix}").unlink(missing_ok=True)


async def test_mark_used_delete_and_archive(memory, tmp_path):
    m = await memory()
    used = await m.save("user", "The user is a nurse.", "USER")
    idle = await m.save("user", "The user once visited Oslo.", "AUTO_REVIEW")
    gone = await m.save("world", "Oslo is in Norway.", "AGENT")
    await m.mark_used([used.id])
    after = await m.get(used.id)
    assert after.uses == 1 and after.last_used is not None
    assert await m.archive_stale(timedelta(days=1)) == 0  # nothing old enough
    assert await m.archive_stale(timedelta(0)) == 2  # never used: idle and gone
    assert [n.id for n in await m.list("user")] == [used.id]
    archived = (tmp_path / "mem" / "user.archived.md").read_text()
    assert f"id={idle.id}" in archived and "reason=stale" in archived
    assert await m.get(gone.id) is None
    assert await m.delete(used.id) is True and await m.delete(used.id) is False
    assert "reason=deleted" in (tmp_path / "mem" / "user.archived.md").read_text()
    keep = await m.save("world", "Gone for good.", "USER")
    assert await m.delete(keep.id, recoverable=False)
    assert "Gone for good" not in (tmp_path / "mem" / "world.archived.md").read_text()


async def test_a_failed_write_leaves_the_file_as_it_was(memory, tmp_path, monkeypatch):
    m = await memory()
    await m.save("user", "first", "USER")
    path = tmp_path / "mem" / "user.md"
    before = path.read_bytes()

    def broken_fsync(fd):
        raise OSError("disk full")

    monkeypatch.setattr(md.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        await m.save("user", "second", "USER")
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []
    monkeypatch.undo()
    await m.save("user", "third", "USER")
    assert [n.text for n in notes_in(path)] == ["first", "third"]


async def test_concurrent_writers_lose_nothing(memory, tmp_path):
    m = await memory()
    categories = ["user", "world", "preference"]
    saved = await asyncio.gather(
        *(m.save(categories[i % 3], f"fact number {i}", "USER") for i in range(60))
    )
    await asyncio.gather(m.mark_used([n.id for n in saved[:10]]), m.delete(saved[-1].id))
    on_disk = [n for c in categories for n in notes_in(tmp_path / "mem" / f"{c}.md")]
    assert sorted(n.text for n in on_disk) == sorted(f"fact number {i}" for i in range(59))
    assert sum([(await m.get(n.id)).uses for n in on_disk]) == 10
    # uses counted while a save writes the file are neither lost nor counted twice
    await asyncio.gather(
        *(m.save(c, f"one more {c}", "USER") for c in categories), m.mark_used([saved[0].id])
    )
    assert (await m.get(saved[0].id)).uses == 2
    for c in categories:  # every file rewritten since: it says the uses
        await m.save(c, f"and another {c}", "USER")
    on_disk = [n for c in categories for n in notes_in(tmp_path / "mem" / f"{c}.md")]
    assert sum(n.uses for n in on_disk) == 11


async def test_uses_wait_in_the_index_until_the_file_changes(memory, tmp_path):
    m = await memory()
    note = await m.save("user", "The user lives in Berlin.", "USER")
    path = tmp_path / "mem" / "user.md"
    before = path.read_bytes()
    await m.mark_used([note.id])
    await m.mark_used([note.id, note.id, "no-such-note"])
    assert path.read_bytes() == before  # a use does not rewrite the file
    used = await m.get(note.id)
    assert used.uses == 2 and used.last_used is not None
    assert [n.uses for n in await m.list("user")] == [2]
    assert (await m.search("Berlin", 5))[0].uses == 2
    await m.close()
    m = await memory()  # kept across a restart
    assert (await m.get(note.id)).uses == 2
    # a hand edit is seen on the next search, and keeps the uses that wait
    path.write_text(path.read_text().replace("Berlin", "Lisbon"))
    later(path)
    found = (await m.search("Lisbon", 5))[0]
    assert (found.text, found.uses) == ("The user lives in Lisbon.", 2)
    # the next write of the file says them; the index no longer holds them
    await m.save("user", "The user has a cat.", "USER")
    assert [n.uses for n in notes_in(path)] == [2, 0]
    assert notes_in(path)[0].last_used == used.last_used
    assert (await m.get(note.id)).uses == 2
    with sqlite3.connect(tmp_path / "mem" / md.INDEX) as db:
        assert db.execute("SELECT count(*) FROM usage").fetchone() == (0,)
    # uses of a note deleted by hand are forgotten at the next start
    await m.mark_used([note.id])
    path.write_text(path.read_text().split("§", 2)[0] + "§" + path.read_text().split("§", 2)[2])
    later(path)
    await m.close()
    m = await memory()
    assert await m.get(note.id) is None
    with sqlite3.connect(tmp_path / "mem" / md.INDEX) as db:
        assert db.execute("SELECT count(*) FROM usage").fetchone() == (0,)


async def test_a_search_looks_for_hand_edits_at_most_every_recheck_seconds(tmp_path):
    m = MdMemory(tmp_path / "mem", recheck=0.3)
    await m.start()
    try:
        await m.save("user", "The user lives in Berlin.", "USER")
        assert len(await m.search("Berlin", 5)) == 1  # looked at the files
        path = tmp_path / "mem" / "user.md"
        path.write_text(path.read_text().replace("Berlin", "Lisbon"))
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))
        assert await m.search("Lisbon", 5) == []  # within the interval: not looked at yet
        await asyncio.sleep(0.3)
        assert [n.text for n in await m.search("Lisbon", 5)] == ["The user lives in Lisbon."]
        # anything but a search looks every time
        path.write_text(path.read_text().replace("Lisbon", "Porto"))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 20_000_000))
        assert [n.text for n in await m.list("user")] == ["The user lives in Porto."]
    finally:
        await m.close()


async def test_uses_reach_the_index_together_after_the_flush_interval(
    memory, tmp_path, monkeypatch
):
    monkeypatch.setattr(md, "FLUSH_EVERY", 0.2)
    m = await memory()
    a = await m.save("user", "The user lives in Berlin.", "USER")
    b = await m.save("world", "Berlin is in Germany.", "AGENT")
    index = tmp_path / "mem" / md.INDEX

    def stored() -> dict[str, int]:
        with sqlite3.connect(index) as db:
            return dict(db.execute("SELECT id, uses FROM usage").fetchall())

    await m.mark_used([a.id, b.id])
    await m.mark_used([a.id])
    assert (await m.get(a.id)).uses == 2  # counted at once, in memory
    assert stored() == {}  # the turn wrote nothing
    await asyncio.sleep(0.3)
    assert stored() == {a.id: 2, b.id: 1}  # one write for both turns
    # a use folded into its file by a rewrite before the flush is not written back
    await m.mark_used([b.id])
    await m.save("world", "Paris is in France.", "AGENT")
    await asyncio.sleep(0.3)
    assert stored() == {a.id: 2}
    assert [n.uses for n in notes_in(tmp_path / "mem" / "world.md")] == [2, 0]
    # close() writes what waits
    await m.mark_used([a.id])
    await m.close()
    assert stored() == {a.id: 3}
