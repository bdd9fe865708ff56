"""The ANN index of the vector memory: hnswlib (cosine), a cache of the vectors in SQLite.

It is saved beside the database (``<db>-memory.hnsw``) with a sidecar (``.json``: dimension,
size, CRC-32) written after it, so an index file that is truncated, corrupt, or not the one the
sidecar describes is never handed to hnswlib's loader: it is rebuilt from SQLite. The index is
saved at shutdown and after a start that changed it, not after every note: at start the core of
truth (SQLite) is compared with it (:meth:`AnnIndex.reconcile`), so notes committed after the
last save are added and deleted ones dropped. Labels are the notes' integer row ids.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import hnswlib
import numpy

log = logging.getLogger("agentik.memory")

M, EF_CONSTRUCTION = 16, 200  # hnswlib's recommended build parameters
EF_SEARCH = 100  # candidates explored per query (B12: recall@10 >= 0.95 on clustered data)
MIN_CAPACITY = 1024


def crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


class AnnIndex:
    """hnswlib's index plus what it holds; not thread-safe: the caller serialises changes."""

    def __init__(self, dimension: int, path: Path | None) -> None:
        self.dimension = dimension
        self.path = path  # None: kept in memory only (an in-memory database)
        self.sidecar = path.with_name(path.name + ".json") if path else None
        self.labels: set[int] = set()  # the live labels (hnswlib keeps deleted ones, marked)
        self.dirty = False  # changed since loaded or saved
        self.index = self._new(MIN_CAPACITY)

    def _new(self, capacity: int) -> hnswlib.Index:
        index = hnswlib.Index(space="cosine", dim=self.dimension)
        index.init_index(max_elements=capacity, ef_construction=EF_CONSTRUCTION, M=M)
        index.set_ef(EF_SEARCH)
        return index

    # --- persistence ----------------------------------------------------------------------

    def load(self) -> bool:
        """Load the saved index if its sidecar vouches for it; False (and an empty index) when
        it is missing, corrupt or of another dimension."""
        if self.path is None or self.sidecar is None or not self.path.exists():
            return False
        try:
            meta = json.loads(self.sidecar.read_text())
            if meta.get("dimension") != self.dimension:
                raise ValueError(f"dimension {meta.get('dimension')}, not {self.dimension}")
            if meta.get("size") != self.path.stat().st_size or meta.get("crc32") != crc32(
                self.path
            ):
                raise ValueError("the file is not the one saved (size or checksum differ)")
            index = hnswlib.Index(space="cosine", dim=self.dimension)
            index.load_index(str(self.path), max_elements=0)
            index.set_ef(EF_SEARCH)
            labels = set(meta["labels"])
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
            log.warning("memory index %s is unusable (%s); rebuilding it from the database",
                        self.path, e)  # fmt: skip
            return False
        self.index, self.labels, self.dirty = index, labels, False
        return True

    def save(self) -> None:
        """Write the index, then its sidecar, each to a temporary file renamed over the old."""
        if self.path is None or self.sidecar is None:
            return
        # of this process: instances on one host may share the file (the sidecar's checksum
        # turns a mixed pair into a rebuild, never a wrong index)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            self.index.save_index(str(tmp))
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            size, crc = tmp.stat().st_size, crc32(tmp)
            os.replace(tmp, self.path)
            meta = {"dimension": self.dimension, "size": size, "crc32": crc,
                    "labels": sorted(self.labels)}  # fmt: skip
            side = self.sidecar.with_name(f"{self.sidecar.name}.{os.getpid()}.tmp")
            side.write_text(json.dumps(meta))
            os.replace(side, self.sidecar)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        self.dirty = False

    # --- contents -------------------------------------------------------------------------

    def rebuild(self, labels: Sequence[int], vectors: numpy.ndarray) -> None:
        self.index = self._new(max(MIN_CAPACITY, 2 * len(labels)))
        self.labels = set()
        self.add(labels, vectors, threads=-1)

    def reconcile(self, live: Iterable[int]) -> tuple[list[int], int]:
        """Drop the labels not ``live``; returns the live labels missing from the index (to
        :meth:`add` with their vectors) and how many were dropped."""
        live = set(live)
        dropped = self.labels - live
        for label in dropped:
            self.remove(label)
        return sorted(live - self.labels), len(dropped)

    def add(self, labels: Sequence[int], vectors: numpy.ndarray, threads: int = 1) -> None:
        if not len(labels):
            return
        needed = self.index.get_current_count() + len(labels)
        capacity = self.index.get_max_elements()
        if needed > capacity:  # grow in place, doubling: no rebuild
            self.index.resize_index(max(needed, 2 * capacity))
        self.index.add_items(vectors, numpy.asarray(labels, dtype=numpy.int64), num_threads=threads)
        self.labels.update(labels)
        self.dirty = True

    def remove(self, label: int) -> None:
        if label in self.labels:
            self.index.mark_deleted(label)
            self.labels.discard(label)
            self.dirty = True

    def query(self, vector: numpy.ndarray, k: int) -> list[tuple[int, float]]:
        """Up to ``k`` nearest live vectors, nearest first: (label, cosine). The cosine is
        exact (hnswlib computes it against the stored vector); only which vectors are found
        is approximate."""
        k = min(k, len(self.labels))
        if k == 0:
            return []
        self.index.set_ef(max(EF_SEARCH, k))
        while True:
            try:
                labels, distances = self.index.knn_query(vector, k=k, num_threads=1)
            except RuntimeError:  # fewer than k reachable (many deleted): ask for fewer
                if k == 1:
                    return []
                k //= 2
                continue
            return list(zip(labels[0].tolist(), (1.0 - distances[0]).tolist(), strict=True))

    @property
    def deleted(self) -> int:
        """Vectors marked deleted that still take room (a rebuild drops them)."""
        return int(self.index.get_current_count()) - len(self.labels)
