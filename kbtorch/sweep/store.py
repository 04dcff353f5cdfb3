"""The results of a sweep: one SQLite file, one row per point keyed by its stable key.

NOTE: SQLite (WAL mode) rather than Parquet shards: each finished point (or chunk) is one
small transaction that is durable once committed, so a sweep killed at any moment (even
``kill -9``) loses at most the points in flight, never a written one, and never leaves a
half-written file; ``INSERT OR IGNORE`` on the primary key makes a resumed or repeated run
idempotent (no duplicate rows); readers (export, plots) see a consistent snapshot while the
driver writes. Parquet shards would need one file per chunk, a compaction step, and care
with files torn by a kill; Parquet remains an export format (``--export parquet``).
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from importlib import metadata

__all__ = ["Store", "point_key", "kbtorch_version"]

_SCHEMA = """CREATE TABLE IF NOT EXISTS points (
    key TEXT PRIMARY KEY, spec TEXT NOT NULL, point TEXT NOT NULL, row TEXT NOT NULL,
    error TEXT, finished REAL NOT NULL)"""


def kbtorch_version() -> str:
    try:
        return metadata.version("kbtorch")
    except metadata.PackageNotFoundError:
        return "unknown"


def point_key(canonical: dict) -> str:
    """sha256 of the point's canonical JSON (sorted keys, no spaces) plus the kbtorch version."""
    text = json.dumps({"point": canonical, "kbtorch": kbtorch_version()}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class Store:
    """``points(key, spec, point, row, error, finished)``: the point and its figures as JSON."""

    def __init__(self, path: str):
        self.path = path
        self.db = sqlite3.connect(path, timeout=30)
        self.db.execute("PRAGMA journal_mode=WAL")
        # NOTE: FULL makes every commit durable on power loss too; a kill -9 alone only needs WAL.
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute(_SCHEMA)
        self.db.commit()

    def keys(self) -> set:
        return {k for (k,) in self.db.execute("SELECT key FROM points")}

    def put(self, spec: str, items) -> None:
        """Write ``(key, point dict, row dict)`` items in one transaction; a key already stored stays."""
        now = time.time()
        with self.db:
            self.db.executemany("INSERT OR IGNORE INTO points VALUES (?, ?, ?, ?, ?, ?)", [
                (key, spec, json.dumps(point, sort_keys=True), json.dumps(row, sort_keys=True), row.get("error"), now)
                for key, point, row in items])

    def rows(self, keys=None) -> dict:
        """``{key: row dict}`` of the stored points (of ``keys`` only, if given)."""
        out = {k: json.loads(r) for k, r in self.db.execute("SELECT key, row FROM points")}
        return out if keys is None else {k: out[k] for k in keys if k in out}

    def count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM points").fetchone()[0]

    def close(self) -> None:
        self.db.close()
