"""Per-point limits of a sweep (kbtorch/sweep/guard.py): a point that hangs (a busy loop, a
sleep) or grows without bound fails alone, naming its limit, and the sweep goes on."""
import json
import threading
import time
from pathlib import Path

import pytest

from kbtorch.cli import main

TINY = Path(__file__).parent / "data" / "tiny.toml"
HELPER = '''
import time


def spins(machine, n=1):
    while True:
        pass


def sleeps(machine, n=1):
    time.sleep(60)


def hoards(machine, n=1):
    return {"latency_ns": float(len(bytearray(n << 30)))}


def fine(machine, n=1):
    return {"latency_ns": float(n)}
'''


def _sweep(tmp_path, capsys, body: str, *args) -> dict:
    pytest.importorskip("pandas")
    (tmp_path / "guard_helper.py").write_text(HELPER)
    spec = tmp_path / "study.toml"
    spec.write_text(f'[sweep]\ntopology = "{TINY}"\n' + body + '[workloads.f]\nfn = "guard_helper:fine"\n')
    main(["sweep", str(spec), "--workers", "1", "--json", *args])
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("fn", ["spins", "sleeps"])
def test_point_timeout(tmp_path, capsys, fn):
    t0 = time.perf_counter()
    data = _sweep(tmp_path, capsys, f'[workloads.h]\nfn = "guard_helper:{fn}"\n', "--point-timeout", "0.3")
    assert time.perf_counter() - t0 < 5
    assert data["points"] == 2 and len(data["failed"]) == 1
    assert data["failed"][0]["error"].startswith("PointTimeout: the point ran longer than its time limit of 0.3 s")


def test_point_timeout_in_a_worker_thread(tmp_path):
    from kbtorch.sweep.guard import PointTimeout, guard
    caught = []

    def work():
        try:
            with guard(0.2, None):
                while True:
                    pass
        except PointTimeout as exc:
            caught.append(str(exc))
    t = threading.Thread(target=work)
    t.start()
    t.join(10)
    assert not t.is_alive() and caught and "time limit" in caught[0]


def test_point_memory_limit(tmp_path, capsys):
    data = _sweep(tmp_path, capsys, '[workloads.m]\nfn = "guard_helper:hoards"\nn = 64\n', "--point-memory", "256MiB")
    assert data["points"] == 2 and len(data["failed"]) == 1
    assert data["failed"][0]["error"] == ("MemoryError: out of memory; the point needed more than its memory limit of "
                                          "268435456 bytes (KBTORCH_MAX_POINT_BYTES or --point-memory)")


def test_dask_sweep_stuck_in_c_code_stops(tmp_path, capsys, monkeypatch):
    """A sleep in a Dask worker thread is out of the watchdog's reach: the driver stops the
    sweep as stalled (one line, exit 2) with the finished points stored, instead of hanging."""
    from kbtorch.sweep import runner
    monkeypatch.setattr(runner, "STALL_GRACE_S", 3.0)
    pytest.importorskip("pandas")
    (tmp_path / "guard_helper.py").write_text(HELPER)
    spec = tmp_path / "study.toml"
    spec.write_text(f'[sweep]\ntopology = "{TINY}"\n[workloads.h]\nfn = "guard_helper:sleeps"\n')
    t0 = time.perf_counter()
    assert main(["sweep", str(spec), "--workers", "2", "--point-timeout", "0.5", "--json"]) == 2
    assert time.perf_counter() - t0 < 45
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "SweepStalled" and data["message"].startswith("no point finished in 3.5 s")
