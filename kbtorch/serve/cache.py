"""Simulated step times that survive the process: a table ``serve_steps`` in an SQLite file
(a sweep's store, ``kbtorch sweep``, or a file of its own), keyed by everything the time depends
on (the machine's content digest, the model, the plan in words, the fidelity, the shape) and the kbtorch
version that simulated it.

Every point of a sweep that serves on the same machine reads the shapes any earlier point
simulated (Dask workers too: SQLite serialises their writes), and a sweep run again starts
warm. NOTE: a time from another kbtorch version is never read (the simulator may have
changed); a file that is not SQLite, or a store whose table has another layout, is refused
naming the file.
"""
from __future__ import annotations

import json
import os
import sqlite3
from importlib import metadata

_SCHEMA = "CREATE TABLE IF NOT EXISTS serve_steps (key TEXT PRIMARY KEY, version TEXT NOT NULL, ns REAL NOT NULL)"
#: Seconds a writer waits for another process's write to finish.
LOCK_TIMEOUT_S = 30.0
_HEADER = b"SQLite format 3\x00"


def version() -> str:
    try:
        return metadata.version("kbtorch")
    except metadata.PackageNotFoundError:
        return "unknown"


class StepCache:
    """``cache.get(key)`` -> ns or None; ``cache.put(key, ns)``. ``key``: a tuple of JSON values."""

    def __init__(self, path: str):
        path = os.fspath(path)
        if os.path.isdir(path):
            raise ValueError(f"step cache {path!r}: is a directory (give an SQLite file)")
        if os.path.exists(path) and os.path.getsize(path):
            with open(path, "rb") as fh:
                if fh.read(16) != _HEADER:
                    raise ValueError(f"step cache {path!r}: not an SQLite file (refused: it would be overwritten)")
        self.path, self.version = path, version()
        try:
            self._db = sqlite3.connect(path, timeout=LOCK_TIMEOUT_S)
            self._db.execute(_SCHEMA)
            cols = [row[1] for row in self._db.execute("PRAGMA table_info(serve_steps)")]
        except sqlite3.Error as exc:
            code = getattr(exc, "sqlite_errorname", None)
            raise ValueError(f"step cache {path!r}: {exc}{f' ({code})' if code else ''}") from None
        if cols != ["key", "version", "ns"]:
            self._db.close()
            raise ValueError(f"step cache {path!r}: its table serve_steps has columns {cols}, not key, version, ns")

    @staticmethod
    def _key(key: tuple) -> str:
        return json.dumps(list(key), separators=(",", ":"))

    def get(self, key: tuple) -> float | None:
        row = self._db.execute("SELECT ns FROM serve_steps WHERE key = ? AND version = ?",
                               (self._key(key), self.version)).fetchone()
        return None if row is None else row[0]

    def put(self, key: tuple, ns: float) -> None:
        with self._db:
            self._db.execute("INSERT OR REPLACE INTO serve_steps VALUES (?, ?, ?)", (self._key(key), self.version, ns))

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM serve_steps WHERE version = ?", (self.version,)).fetchone()[0]

    def close(self) -> None:
        self._db.close()
