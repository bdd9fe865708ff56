"""The persona file, re-read when it changes."""

from __future__ import annotations

import logging
import os
import threading
import weakref
from pathlib import Path

log = logging.getLogger("agentik.soul")

MAX_SOUL_BYTES = 64 * 1024


def read_soul(path: Path) -> str:
    """The file's text; ``ValueError`` saying why it cannot be the persona."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SOUL_BYTES + 1)
    except OSError as e:
        raise ValueError(f"cannot read it: {e.strerror}") from None
    if len(raw) > MAX_SOUL_BYTES:
        raise ValueError(f"larger than {MAX_SOUL_BYTES // 1024} KiB")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None


class SoulFile:
    """The persona's text, kept in memory and read again when the file's stamp changes."""

    _by_path: weakref.WeakValueDictionary[Path, SoulFile] = weakref.WeakValueDictionary()

    @classmethod
    def of(cls, path: Path) -> SoulFile:
        """One object per file, shared by everything built from the same settings."""
        path = Path(os.path.abspath(path))
        found = cls._by_path.get(path)
        if found is None:
            found = cls._by_path[path] = cls(path)
        return found

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._text = ""
        self._failed = False

    def text(self) -> str:
        """The current text (re-read when the file changed)."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError as e:
            self._warn(f"cannot read it: {e.strerror}")
            return self._text
        if stamp != self._stamp:
            with self._lock:
                try:
                    self._text = read_soul(self.path)
                except ValueError as e:
                    self._warn(str(e))
                    return self._text
                self._stamp, self._failed = stamp, False
        return self._text

    def render(self) -> str | None:
        return self.text().strip() or None

    def _warn(self, why: str) -> None:
        if not self._failed:  # once per failure, not at every prompt built
            log.warning("AGENTIK_SOUL=%s: %s; keeping the last text read", self.path, why)
            self._failed = True
