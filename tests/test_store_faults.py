"""Sweep store faults (kbtorch/sweep/store.py): every unusable store is refused before any point
runs, with a StoreError naming the store and the fault, in under a second, the file unchanged;
a damaged row is named and skipped; a lock held elsewhere waits a short time; Ctrl-C stops
cleanly with what finished stored."""
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("pandas")
pytest.importorskip("distributed")
pytest.importorskip("tqdm")

import kbtorch.sweep as sweep  # noqa: E402
from kbtorch.cli import main  # noqa: E402
from kbtorch.sweep.store import Store, StoreError  # noqa: E402

TINY = str(Path(__file__).parent / "data" / "tiny.toml")
HELPER = '''
import os


def summary(machine, n=1):
    return {"latency_ns": float(n * len(machine.pes)), "bottleneck": "none"}


def interrupt(machine, n=1):
    if n == 3:
        raise KeyboardInterrupt
    return {"latency_ns": float(n)}


def never(machine, n=1):
    raise AssertionError("a point ran although the store was refused")
'''


def _spec(tmp_path, fn: str = "summary", values: str = "[1, 2]") -> Path:
    (tmp_path / "store_helper.py").write_text(HELPER)
    p = tmp_path / "study.toml"
    p.write_text(f'[sweep]\ntopology = "{TINY}"\n[workloads.s]\nfn = "store_helper:{fn}"\nn = {values}\n')
    return p


def _digest(path: Path):
    """The bytes of a file (or None: no file, or not a regular file), to show it unchanged."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _refused(spec: Path, store: str, fault: str) -> None:
    """The sweep refuses ``store`` by name and ``fault``, fast, before any point runs, leaving it as it was."""
    before = _digest(Path(store)) if store else None
    t0 = time.perf_counter()
    with pytest.raises(StoreError) as err:
        sweep.run(spec, workers=1, store=store, progress=False)
    assert time.perf_counter() - t0 < 1.0
    assert f"store '{store}'" in str(err.value) and fault in str(err.value), str(err.value)
    if store:
        assert _digest(Path(store)) == before
        assert not Path(store + "-wal").exists() or Path(store).exists()


@pytest.fixture
def never_spec(tmp_path):
    return _spec(tmp_path, "never")


def _complete_store(tmp_path) -> Path:
    (tmp_path / "complete").mkdir()
    spec = _spec(tmp_path / "complete")
    store = tmp_path / "complete.sqlite"
    sweep.run(spec, workers=1, store=str(store), progress=False)
    return store


def test_empty_store_path(never_spec):
    _refused(never_spec, "", "empty path")


def test_empty_store_path_cli(never_spec, capsys):
    assert main(["sweep", str(never_spec), "--workers", "1", "--store", "", "--json"]) == 2
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["error"] is True and data["kind"] == "StoreError" and "empty path" in data["message"]
    assert err.count("\n") == 1 and "Traceback" not in err


def test_truncated_store(tmp_path, never_spec):
    store = _complete_store(tmp_path)
    data = store.read_bytes()
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(data[:len(data) // 3] if len(data) > 4096 else data[:100])
    _refused(never_spec, str(cut), "is damaged (database disk image is malformed): move it away")
    cut.write_bytes(data[:10])                  # cut inside the header
    _refused(never_spec, str(cut), "is not an SQLite database (a garbage or truncated file)")


def test_garbage_store(tmp_path, never_spec):
    bad = tmp_path / "garbage.sqlite"
    bad.write_bytes(b"this is no database\n" * 50)
    _refused(never_spec, str(bad), "not an SQLite database")


def test_damaged_pages(tmp_path, never_spec):
    store = _complete_store(tmp_path)
    data = bytearray(store.read_bytes())
    data[100:len(data)] = b"\xff" * (len(data) - 100)       # the header stays, every page is garbage
    store.write_bytes(bytes(data))
    _refused(never_spec, str(store), "damaged")


def test_foreign_points_table(tmp_path, never_spec):
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE points (x REAL, y REAL)")
        db.execute("INSERT INTO points VALUES (1, 2)")
    db.close()
    _refused(never_spec, str(other), "'points' table of another program")


def test_directory(tmp_path, never_spec):
    _refused(never_spec, str(tmp_path), "is a directory")


def test_missing_folder(tmp_path, never_spec):
    _refused(never_spec, str(tmp_path / "no" / "such" / "s.sqlite"), "does not exist")
    assert not (tmp_path / "no").exists()


def test_dev_null(never_spec):
    _refused(never_spec, os.devnull, "not a regular file")


def test_the_spec_itself(never_spec):
    _refused(never_spec, str(never_spec), "is the sweep spec itself")


def test_read_only_complete_store(tmp_path, never_spec):
    store = _complete_store(tmp_path)
    store.chmod(0o444)
    try:
        _refused(never_spec, str(store), "read-only")
    finally:
        store.chmod(0o644)


def test_lock_held_by_another_process(tmp_path, never_spec, monkeypatch):
    store = _complete_store(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", "import sqlite3, sys, time\n"
                               f"db = sqlite3.connect({str(store)!r}, isolation_level=None)\n"
                               "db.execute('BEGIN EXCLUSIVE'); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("KBTORCH_STORE_TIMEOUT_S", "0.2")
        _refused(never_spec, str(store), "locked by another process (waited 0.2 s")
    finally:
        holder.kill()
        holder.wait()


def test_bad_lock_timeout(tmp_path, never_spec, monkeypatch):
    monkeypatch.setenv("KBTORCH_STORE_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="KBTORCH_STORE_TIMEOUT_S='soon' is not a number of seconds"):
        sweep.run(never_spec, workers=1, store=str(tmp_path / "s.sqlite"), progress=False)
    assert not (tmp_path / "s.sqlite").exists()


def test_damaged_row_named_and_skipped(tmp_path, capsys):
    spec = _spec(tmp_path)
    store = tmp_path / "rows.sqlite"
    sweep.run(spec, workers=1, store=str(store), progress=False)
    with sqlite3.connect(store) as db:
        (rowid, key), = db.execute("SELECT rowid, key FROM points WHERE row LIKE '%\"n\": 2%'").fetchall()
        db.execute("UPDATE points SET row = '{broken' WHERE rowid = ?", (rowid,))
    db.close()
    assert main(["sweep", str(spec), "--workers", "1", "--store", str(store), "--json"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["ran"] == 1 and data["reused"] == 1 and data["points"] == 2
    assert data["damaged"] == [{"rowid": rowid, "key": key, "fault": data["damaged"][0]["fault"]}]
    assert f"row {rowid} (key {key[:12]}) is damaged and skipped: its row is not JSON" in err
    s = Store(str(store))
    try:
        assert sorted(r["n"] for r in s.rows().values()) == [1, 2] and s.damaged == []    # replaced by the re-run
    finally:
        s.close()


def test_ctrl_c_stops_cleanly(tmp_path, capsys):
    spec = _spec(tmp_path, "interrupt", "[1, 2, 3, 4]")
    store = tmp_path / "int.sqlite"
    assert main(["sweep", str(spec), "--workers", "1", "--store", str(store), "--json"]) == 130
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("kbtorch: interrupted: 2 point(s) of this run stored in")
    assert "run the sweep again to resume" in err
    assert json.loads(out)["kind"] == "SweepInterrupted"
    s = Store(str(store))
    try:
        assert sorted(r["n"] for r in s.rows().values()) == [1, 2]
    finally:
        s.close()
