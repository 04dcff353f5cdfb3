"""Results that stay true: sweep point keys by content (an edited topology is re-simulated, a
touched one is not), limits in the key, --retry-failed, sys.exit in a workload, a topology checked
once per machine; machines equal by content (copies and pickles of ahbm tensors and modules
mix); data_ptr per storage; use() tokens; the flit and element limits; --json errors."""
import copy
import json
import os
import pickle
import threading
import time
from pathlib import Path

import pytest
import torch

import kbtorch
from kbtorch.cli import main
from kbtorch.topology import TopologyError, load_machine, select
from kbtorch.topology.load import validate as validate_mod

TINY = Path(__file__).parent / "data" / "tiny.toml"
DIEWIDE = Path(__file__).parent / "data" / "diewide.toml"
HELPER = '''
import os
import sys


def flaky(machine, n=1, flag=""):
    if flag and os.path.exists(flag):
        raise RuntimeError(f"flag set for {n}")
    return {"latency_ns": float(n)}


def quits(machine, n=1):
    sys.exit(0)
'''


@pytest.fixture(autouse=True)
def _machine_choice():
    """Each test runs on the tiny machine (a small, fast default) and leaves the process'
    machine choice as it found it."""
    saved = select._PROCESS[0]
    select._PROCESS[0] = load_machine(str(TINY))
    yield
    select._PROCESS[0] = saved


def _spec(tmp_path, body: str, topology: str = str(TINY)) -> Path:
    (tmp_path / "results_helper.py").write_text(HELPER)
    p = tmp_path / "study.toml"
    p.write_text(f'[sweep]\ntopology = "{topology}"\n' + body)
    return p


def _sweep(capsys, *args) -> tuple[int, dict]:
    rc = main(["sweep", *map(str, args), "--workers", "1", "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


GEMM = '[workloads.g]\nop = "gemm"\nm = 64\nn = 64\nk = 64\ntile = [32, 32, 64]\ngrid = [2, 2, 1]\n'


# ---------------------------------------------------------------- point keys by content

def test_edited_topology_is_simulated_again(tmp_path, capsys):
    pytest.importorskip("pandas")
    topo = tmp_path / "mine.toml"
    topo.write_text(TINY.read_text())
    spec = _spec(tmp_path, GEMM, str(topo))
    rc, first = _sweep(capsys, spec)
    assert rc == 0 and first["ran"] == 1 and first["reused"] == 0
    rc, again = _sweep(capsys, spec)
    assert again["ran"] == 0 and again["reused"] == 1
    text = TINY.read_text()
    assert "fixed_cycles = 40" in text
    topo.write_text(text.replace("fixed_cycles = 40", "fixed_cycles = 400"))
    rc, edited = _sweep(capsys, spec)
    assert edited["ran"] == 1 and edited["reused"] == 0
    assert edited["rows"][0]["latency_ns"] > first["rows"][0]["latency_ns"]
    rc, fresh = _sweep(capsys, spec, "--store", tmp_path / "fresh.sqlite")
    assert fresh["rows"][0]["latency_ns"] == edited["rows"][0]["latency_ns"]


def test_touched_topology_is_reused(tmp_path, capsys):
    pytest.importorskip("pandas")
    topo = tmp_path / "mine.toml"
    topo.write_text(TINY.read_text())
    spec = _spec(tmp_path, GEMM, str(topo))
    _sweep(capsys, spec)
    os.utime(topo, (time.time() + 5, time.time() + 5))
    rc, again = _sweep(capsys, spec)
    assert again["ran"] == 0 and again["reused"] == 1
    assert main(["sweep", str(spec), "--workers", "1"]) == 0
    assert "0 run now, 1 reused from" in capsys.readouterr().out


def test_limits_in_force_are_in_the_key(tmp_path, capsys, monkeypatch):
    pytest.importorskip("pandas")
    spec = _spec(tmp_path, GEMM)
    # NOTE: a limit the point breaks refuses the whole sweep before any point runs (issue 25) ...
    monkeypatch.setenv("KBTORCH_MAX_TILES", "1")
    rc, limited = _sweep(capsys, spec)
    assert rc == 2 and limited["error"] and "KBTORCH_MAX_TILES" in limited["message"]
    monkeypatch.delenv("KBTORCH_MAX_TILES")
    rc, free = _sweep(capsys, spec)
    assert free["ran"] == 1 and free["failed"] == [] and free["rows"][0]["latency_ns"] > 0
    # ... and one it keeps still makes its points new ones: the limits in force are in the key.
    monkeypatch.setenv("KBTORCH_MAX_MESSAGES", "12345")
    rc, other = _sweep(capsys, spec)
    assert other["ran"] == 1 and other["reused"] == 0


def test_version_is_in_the_key(tmp_path, capsys, monkeypatch):
    pytest.importorskip("pandas")
    from kbtorch.sweep import store
    spec = _spec(tmp_path, '[workloads.f]\nfn = "results_helper:flaky"\n')
    rc, first = _sweep(capsys, spec)
    assert first["ran"] == 1 and store.kbtorch_version() != "unknown"
    monkeypatch.setattr(store, "kbtorch_version", lambda: "99.0")
    rc, newer = _sweep(capsys, spec)
    assert newer["ran"] == 1 and newer["reused"] == 0


def test_garbage_limit_refused_before_any_point(tmp_path, capsys, monkeypatch):
    pytest.importorskip("pandas")
    spec = _spec(tmp_path, GEMM)
    monkeypatch.setenv("KBTORCH_MAX_TILES", "abc")
    t0 = time.perf_counter()
    assert main(["sweep", str(spec), "--workers", "1", "--json"]) == 2
    assert time.perf_counter() - t0 < 1.0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "ValueError" and "KBTORCH_MAX_TILES='abc' is not a positive integer" in data["message"]
    assert not (tmp_path / "study.sqlite").exists()


def test_retry_failed(tmp_path, capsys):
    pytest.importorskip("pandas")
    # NOTE: the flag is a param: every test's helper module is imported once, as the first test's.
    spec = _spec(tmp_path, f'[workloads.f]\nfn = "results_helper:flaky"\nn = [1, 2]\nflag = "{tmp_path / "fail.flag"}"\n')
    (tmp_path / "fail.flag").write_text("")
    rc, first = _sweep(capsys, spec)
    assert len(first["failed"]) == 2
    (tmp_path / "fail.flag").unlink()
    rc, kept = _sweep(capsys, spec)
    assert kept["ran"] == 0 and kept["reused"] == 2 and len(kept["failed"]) == 2
    rc, retried = _sweep(capsys, spec, "--retry-failed")
    assert retried["ran"] == 2 and retried["failed"] == [] and retried["points"] == 2
    assert sorted(r["latency_ns"] for r in retried["rows"]) == [1.0, 2.0]
    rc, after = _sweep(capsys, spec, "--retry-failed")
    assert after["ran"] == 0 and after["reused"] == 2


def test_topology_checked_once_per_machine(tmp_path, monkeypatch):
    pytest.importorskip("pandas")
    import kbtorch.sweep as sweep
    checks = []
    real = validate_mod._Checker.__init__

    def counting(self, path):
        checks.append(path)
        real(self, path)
    monkeypatch.setattr(validate_mod._Checker, "__init__", counting)
    # NOTE: values no other test uses: machines this process has not checked yet.
    spec = _spec(tmp_path, '[axes]\n"issue.fixed_cycles" = [41.25, 42.75]\n'
                 '[workloads.s]\nfn = "results_helper:flaky"\nn = [1, 2, 3]\n')
    df = sweep.run(spec, workers=1, progress=False, store=str(tmp_path / "s.sqlite"))
    assert len(df) == 6 and df["error"].isna().all()
    assert len(checks) == 2          # one per machine: the spec's check; the points build without one


# ---------------------------------------------------------------- per-point limits

def test_workload_calling_sys_exit_fails_its_point(tmp_path, capsys):
    pytest.importorskip("pandas")
    spec = _spec(tmp_path, '[workloads.q]\nfn = "results_helper:quits"\n[workloads.f]\nfn = "results_helper:flaky"\n')
    rc, data = _sweep(capsys, spec)
    assert data["points"] == 2 and len(data["failed"]) == 1
    assert data["failed"][0]["error"] == "SystemExit: the workload called sys.exit(0)"


@pytest.mark.parametrize("args,fault", [
    (["--point-timeout", "0"], "argument --point-timeout: '0' is not a positive number of seconds"),
    (["--point-timeout", "nan"], "argument --point-timeout: 'nan' is not a positive number of seconds"),
    (["--point-memory", "-1"], "argument --point-memory: invalid byte count '-1'"),
])
def test_bad_point_limits(tmp_path, capsys, args, fault):
    spec = _spec(tmp_path, GEMM)
    t0 = time.perf_counter()
    assert main(["sweep", str(spec), *args, "--json"]) == 2
    assert time.perf_counter() - t0 < 1.0
    data = json.loads(capsys.readouterr().out)
    assert data["error"] is True and data["kind"] == "UsageError" and fault in data["message"]
    assert not (tmp_path / "study.sqlite").exists()


# ---------------------------------------------------------------- machines by content

def test_deepcopy_of_an_ahbm_tensor_mixes():
    a = torch.arange(16.0).reshape(4, 4).to("ahbm")
    b = copy.deepcopy(a)
    assert b.machine is a.machine and b.data_ptr() != a.data_ptr()
    torch.testing.assert_close((a + b).cpu(), 2 * torch.arange(16.0).reshape(4, 4))


def test_pickle_of_an_ahbm_tensor_mixes():
    a = torch.arange(6.0).reshape(2, 3).to("ahbm")
    b = pickle.loads(pickle.dumps(a))
    assert type(b) is type(a) and b.machine is a.machine and b.placements == a.placements
    torch.testing.assert_close((a * b).cpu(), torch.arange(6.0).reshape(2, 3) ** 2)


def test_deepcopy_of_a_module_on_ahbm():
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 3).to("ahbm")
    m2 = copy.deepcopy(m)
    x = torch.randn(2, 4)
    ref = torch.nn.functional.linear(x, m.weight.cpu(), m.bias.cpu())
    torch.testing.assert_close((m(x.to("ahbm")) + m2(x.to("ahbm"))).cpu(), 2 * ref)


def test_touched_file_is_the_same_machine(tmp_path):
    topo = tmp_path / "t.toml"
    topo.write_text(TINY.read_text())
    first = load_machine(str(topo))
    os.utime(topo, (time.time() + 10, time.time() + 10))
    second = load_machine(str(topo))
    assert second is first
    topo.write_text(TINY.read_text().replace("fixed_cycles = 40", "fixed_cycles = 44"))
    os.utime(topo, (time.time() + 20, time.time() + 20))
    third = load_machine(str(topo))
    assert third != first and third.digest != first.digest


def test_tensors_of_a_touched_file_mix(tmp_path):
    topo = tmp_path / "t.toml"
    topo.write_text(TINY.read_text())
    with kbtorch.use(str(topo)):
        a = torch.ones(2, 2).to("ahbm")
    os.utime(topo, (time.time() + 10, time.time() + 10))
    with kbtorch.use(str(topo)):
        b = torch.ones(2, 2).to("ahbm")
    torch.testing.assert_close((a + b).cpu(), torch.full((2, 2), 2.0))


def test_machines_of_other_content_still_refused(tmp_path):
    a = torch.ones(2, 2).to("ahbm")
    with kbtorch.use(str(DIEWIDE)):
        b = torch.ones(2, 2).to("ahbm")
    with pytest.raises(RuntimeError, match="two machines"):
        a + b


def test_data_ptr_distinct_per_storage():
    a, b = torch.zeros(4, 4).to("ahbm"), torch.zeros(4, 4).to("ahbm")
    assert a.data_ptr() != 0 and a.data_ptr() != b.data_ptr()
    v = a[1:]
    assert v.data_ptr() - a.data_ptr() == 4 * a.element_size()
    with kbtorch.timing_only():
        c, d = torch.zeros(4, 4).to("ahbm"), torch.zeros(4, 4).to("ahbm")
    assert c.data_ptr() != d.data_ptr() and c[1:].data_ptr() - c.data_ptr() == 16


# ---------------------------------------------------------------- use() tokens

def test_use_tokens_restore_what_they_replaced():
    u1 = kbtorch.use(str(DIEWIDE))
    u2 = kbtorch.use(str(DIEWIDE))
    with u1:
        assert kbtorch.current_machine().name == u1.machine.name
    with u2:
        pass
    assert kbtorch.current_machine() is u2.machine        # the last process choice stands


def test_use_block_restores_the_default():
    before = kbtorch.current_machine()
    with kbtorch.use(str(DIEWIDE)) as m:
        assert kbtorch.current_machine() is m
        with kbtorch.use(str(TINY)) as inner:
            assert kbtorch.current_machine() is inner
        assert kbtorch.current_machine() is m
    assert kbtorch.current_machine() is before


def test_use_entered_twice_nests():
    before = kbtorch.current_machine()
    u = kbtorch.use(str(DIEWIDE))
    with u:
        with u:
            assert kbtorch.current_machine() is u.machine
        assert kbtorch.current_machine() is u.machine
    assert kbtorch.current_machine() is before


def test_use_block_is_the_threads_own():
    seen, inside, leave = {}, threading.Event(), threading.Event()
    before = kbtorch.current_machine()

    def other():
        with kbtorch.use(str(DIEWIDE)) as m:
            seen["other"] = kbtorch.current_machine() is m
            inside.set()
            leave.wait(10)
    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    seen["main"] = kbtorch.current_machine() is before
    leave.set()
    t.join(10)
    assert seen == {"other": True, "main": True}


@pytest.mark.parametrize("arg,exc,fault", [
    ("nope", TopologyError, "unknown topology"),
    ("", TopologyError, "unknown topology"),
    ("/no/such/file.toml", TopologyError, "no such topology file"),
    (str(Path(__file__).parent), TopologyError, "is a directory"),
    (os.devnull, TopologyError, "not a regular file"),
    (None, TypeError, "got None"),
    (5, TypeError, "got int 5"),
])
def test_use_bad_input(arg, exc, fault):
    before = kbtorch.current_machine()
    t0 = time.perf_counter()
    with pytest.raises(exc, match=fault):
        kbtorch.use(arg)
    assert time.perf_counter() - t0 < 1.0
    assert kbtorch.current_machine() is before


def test_bad_topology_variable(monkeypatch):
    select._PROCESS[0] = None
    monkeypatch.setenv("KBTORCH_TOPOLOGY", "nope")
    with pytest.raises(TopologyError, match=r"unknown topology .*from \$KBTORCH_TOPOLOGY"):
        kbtorch.current_machine()


# ---------------------------------------------------------------- flit and element limits

@pytest.mark.parametrize("args,fault", [
    (["bench", "transfer", "--src", "0", "--dst", "1", "--bytes", "2GiB", "--flit-exact"],
     "argument --bytes with --flit-exact: 8388608 flits exceed the limit"),
    (["bench", "gemm", "--m", "65536", "--n", "65536", "--k", "65536", "--flit-exact"],
     "--flit-exact gemm M=65536 N=65536 K=65536 (one flit at least per 256 elements read): 33554432 flits exceed"),
    (["bench", "gemm", "--m", "40000", "--n", "40000", "--k", "40000", "--check"],
     "--check of M=40000 N=40000 K=40000: A: 1600000000 elements exceed the limit of 268435456"),
])
def test_sizes_bounded_before_work(capsys, args, fault):
    t0 = time.perf_counter()
    assert main([*args, "--topology", str(TINY), "--json"]) == 2
    assert time.perf_counter() - t0 < 1.0
    data = json.loads(capsys.readouterr().out)
    assert fault in data["message"], data["message"]


def test_flit_mode_collective_bounded(capsys, monkeypatch):
    monkeypatch.setenv("KBTORCH_MAX_FLITS", "64")
    t0 = time.perf_counter()
    assert main(["bench", "allreduce", "--topology", str(TINY), "--bytes", "64KiB", "--mode", "flit", "--json"]) == 2
    assert time.perf_counter() - t0 < 1.0
    data = json.loads(capsys.readouterr().out)
    # NOTE: refused before anything is built, on a lower bound of the flits sent (each other member's share)
    assert data["message"].startswith("argument --bytes: a flit-exact all_reduce of 65536 bytes over 8 members sends "
                                      "at least: 1792 flits exceed the limit of 64") and "KBTORCH_MAX_FLITS" in data["message"]
    monkeypatch.setenv("KBTORCH_MAX_FLITS", "2000")                # past the bound: the run counts its flits
    assert main(["bench", "allreduce", "--topology", str(TINY), "--bytes", "64KiB", "--mode", "flit", "--json"]) == 2
    data = json.loads(capsys.readouterr().out)
    assert "a flit-exact run (one event per flit)" in data["message"] and "KBTORCH_MAX_FLITS" in data["message"]


def test_group_without_instance_refused(capsys):
    assert main(["bench", "allreduce", "--topology", str(TINY), "--group", "cube:", "--bytes", "4KiB", "--json"]) == 2
    data = json.loads(capsys.readouterr().out)
    assert "group 'cube:': expected an instance number after ':'" in data["message"]


# ---------------------------------------------------------------- --json errors

@pytest.mark.parametrize("args,kind,fault", [
    (["topo", "/no/such.toml"], "TopologyError", "no such topology file"),
    (["bench", "transfer", "--src", "0", "--dst", "0"], "ValueError", "a transfer needs two PEs"),
    (["bench", "nothing"], "UsageError", "invalid choice: 'nothing'"),
    (["bench", "hbm", "--bytes", "lots"], "UsageError", "invalid byte count 'lots'"),
])
def test_json_errors_are_one_object(capsys, args, kind, fault):
    assert main([*args, "--topology", str(TINY), "--json"]) == 2
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert set(data) == {"error", "kind", "message"} and data["error"] is True
    assert data["kind"] == kind and fault in data["message"]
    assert err.startswith("kbtorch: error: ") and fault in err
