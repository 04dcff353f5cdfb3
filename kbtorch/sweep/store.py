"""The results of a sweep: one SQLite file, one row per point keyed by its stable key.

NOTE: SQLite (WAL mode) rather than Parquet shards: each finished point (or chunk) is one
small transaction that is durable once committed, so a sweep killed at any moment (even
``kill -9``) loses at most the points in flight, never a written one, and never leaves a
half-written file; a stored key is never overwritten by the same result (a resumed or
repeated run adds no duplicate rows); readers (export, plots) see a consistent snapshot while
the driver writes. Parquet shards would need one file per chunk, a compaction step, and care
with files torn by a kill; Parquet remains an export format (``--export parquet``).

A store is opened and checked before any point runs (:class:`StoreError` names the file and
the fault: a directory, a missing folder, a device, a file that is not SQLite or is damaged,
a table of another program, a read-only file, a lock another process holds longer than
``$KBTORCH_STORE_TIMEOUT_S``). A damaged row is named and skipped: its point runs again and
its row is replaced.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import stat
import time
import tomllib
from importlib import metadata
from pathlib import Path

__all__ = ["Store", "StoreError", "point_key", "kbtorch_version", "LOCK_TIMEOUT_S"]

COLUMNS = ("key", "spec", "point", "row", "error", "finished")
_SCHEMA = """CREATE TABLE IF NOT EXISTS points (
    key TEXT PRIMARY KEY, spec TEXT NOT NULL, point TEXT NOT NULL, row TEXT NOT NULL,
    error TEXT, finished REAL NOT NULL)"""
#: A stored row stays unless it is a failure or damaged: then a new result replaces it.
_PUT = """INSERT INTO points VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(key) DO UPDATE SET
    spec = excluded.spec, point = excluded.point, row = excluded.row, error = excluded.error,
    finished = excluded.finished WHERE points.error IS NOT NULL
    OR CASE WHEN json_valid(points.row) THEN json_extract(points.row, '$.key') IS NOT points.key ELSE 1 END"""
#: Seconds a store waits for a lock another process holds (``$KBTORCH_STORE_TIMEOUT_S``).
LOCK_TIMEOUT_S = 5.0
_ENV_TIMEOUT = "KBTORCH_STORE_TIMEOUT_S"
_HEADER = b"SQLite format 3\x00"
_KEY = re.compile(r"^[0-9a-f]{64}$")


class StoreError(ValueError):
    """A sweep store that cannot be used: the message names the file and the fault."""

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(f"store '{path}': {message}")


def kbtorch_version() -> str:
    """The installed version, else (run from a checkout) the version of its pyproject.toml."""
    try:
        return metadata.version("kbtorch")
    except metadata.PackageNotFoundError:
        pass
    try:
        with open(Path(__file__).resolve().parents[2] / "pyproject.toml", "rb") as fh:
            return str(tomllib.load(fh)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def point_key(canonical: dict) -> str:
    """sha256 of the point's canonical JSON (sorted keys, no spaces) plus the kbtorch version."""
    text = json.dumps({"point": canonical, "kbtorch": kbtorch_version()}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def lock_timeout_s() -> float:
    text = os.environ.get(_ENV_TIMEOUT)
    if text is None:
        return LOCK_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise ValueError(f"${_ENV_TIMEOUT}={text!r} is not a number of seconds (0 to 3600)")
    return value


def _check_path(path: str, spec_path: str | None) -> None:
    """StoreError for a path that cannot hold a store, before SQLite opens it."""
    if not path:
        raise StoreError(path, "empty path (name a file, e.g. study.sqlite)")
    p = Path(path)
    if not p.parent.is_dir():
        raise StoreError(path, f"folder '{p.parent}' does not exist")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if not os.access(p.parent, os.W_OK):
            raise StoreError(path, f"folder '{p.parent}' is not writable") from None
        return
    if stat.S_ISDIR(st.st_mode):
        raise StoreError(path, "is a directory, not a store file")
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(path, "is not a regular file (a device or a pipe cannot hold a store)")
    if spec_path is not None and os.path.exists(spec_path) and os.path.samefile(path, spec_path):
        raise StoreError(path, "is the sweep spec itself (give the store another name)")
    if not st.st_mode & 0o222 or not os.access(path, os.W_OK):
        raise StoreError(path, "is read-only (make it writable, or give another --store)")
    if st.st_size:
        with open(path, "rb") as fh:
            head = fh.read(len(_HEADER))
        if head != _HEADER:
            raise StoreError(path, "is not an SQLite database (a garbage or truncated file): move it away "
                                   "or give another --store")


class Store:
    """``points(key, spec, point, row, error, finished)``: the point and its figures as JSON."""

    def __init__(self, path: str, spec_path: str | None = None):
        self.path = os.fspath(path)
        _check_path(self.path, spec_path)
        self.timeout_s = lock_timeout_s()
        self.damaged: list = []
        try:
            self.db = sqlite3.connect(self.path, timeout=self.timeout_s)
        except sqlite3.Error as exc:
            raise StoreError(self.path, f"cannot open: {exc}") from None
        try:
            self._prepare()
        except BaseException:
            self.db.close()
            raise

    def _fault(self, exc: sqlite3.Error) -> StoreError:
        text = str(exc)
        if "locked" in text or "busy" in text:
            return StoreError(self.path, f"locked by another process (waited {self.timeout_s:g} s; "
                                         f"set ${_ENV_TIMEOUT} to wait longer)")
        if "readonly" in text or "read-only" in text:
            return StoreError(self.path, "is read-only (make it writable, or give another --store)")
        if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError) \
                or "malformed" in text or "not a database" in text:
            return StoreError(self.path, f"is damaged ({text}): move it away or give another --store")
        return StoreError(self.path, text)

    def _prepare(self) -> None:
        try:
            # NOTE: read-only checks first: a store refused is left byte for byte as it was.
            ok = self.db.execute("PRAGMA quick_check").fetchone()[0]
            if ok != "ok":
                raise StoreError(self.path, f"is damaged ({ok}): move it away or give another --store")
            cols = tuple(r[1] for r in self.db.execute("PRAGMA table_info(points)"))
            if cols and cols != COLUMNS:
                raise StoreError(self.path, f"has a 'points' table of another program (columns {', '.join(cols)}; "
                                            f"a sweep store has {', '.join(COLUMNS)}): give another --store")
            self.db.execute("PRAGMA journal_mode=WAL")
            # NOTE: FULL makes every commit durable on power loss too; a kill -9 alone only needs WAL.
            self.db.execute("PRAGMA synchronous=FULL")
            with self.db:
                # NOTE: takes the write lock at once, so a lock held elsewhere is found now.
                self.db.execute("BEGIN IMMEDIATE")
                self.db.execute(_SCHEMA)
        except sqlite3.Error as exc:
            raise self._fault(exc) from None

    def keys(self, retry_failed: bool = False) -> set:
        """Keys of the points stored whole (not damaged; with ``retry_failed``, not failed)."""
        return {k for k, row in self.rows().items() if not (retry_failed and row.get("error"))}

    def put(self, spec: str, items) -> None:
        """Write ``(key, point dict, row dict)`` items in one transaction; a key stored whole
        stays (a failed or damaged one is replaced)."""
        now = time.time()
        try:
            with self.db:
                self.db.executemany(_PUT, [(key, spec, json.dumps(point, sort_keys=True),
                                            json.dumps(row, sort_keys=True), row.get("error"), now)
                                           for key, point, row in items])
        except sqlite3.Error as exc:
            raise self._fault(exc) from None

    def rows(self, keys=None) -> dict:
        """``{key: row dict}`` of the points stored whole (of ``keys`` only, if given); a
        damaged row is skipped and named in ``damaged`` (``(rowid, key, fault)``)."""
        out, damaged = {}, []
        try:
            cursor = self.db.execute("SELECT rowid, key, row FROM points")
            for rowid, key, text in cursor:
                fault = _row_fault(key, text)
                if fault:
                    damaged.append((rowid, key, fault))
                    continue
                out[key] = json.loads(text)
        except sqlite3.Error as exc:
            raise self._fault(exc) from None
        self.damaged = damaged
        return out if keys is None else {k: out[k] for k in keys if k in out}

    def count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM points").fetchone()[0]

    def close(self) -> None:
        self.db.close()


def _row_fault(key, text) -> str | None:
    """Why a stored row cannot be used, or None."""
    if not isinstance(key, str) or not _KEY.match(key):
        return f"its key {key!r:.40} is not a point key"
    if not isinstance(text, str):
        return f"its row is {type(text).__name__}, not JSON text"
    try:
        row = json.loads(text)
    except ValueError as exc:
        return f"its row is not JSON ({exc})"
    if not isinstance(row, dict) or row.get("key") != key:
        return "its row is not the figures of its key"
    return None
