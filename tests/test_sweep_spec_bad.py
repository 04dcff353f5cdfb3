"""Hostile sweep specs (issue 25): each refused before any point runs, fast, naming the file,
the axis or workload and the field, with the store untouched; bounds before work; exit
status and outputs; code named by a spec.

Every case runs twice: ``load_spec`` (SpecError, its message, under 1 s) and the command line
(exit 2, one ``kbtorch: error:`` line, no traceback, a store's bytes unchanged and no default
store created).
"""
import json
import os
import socket
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from kbtorch.cli import main
from kbtorch.sweep.spec import SpecError, load_spec

TINY = str(Path(__file__).parent / "data" / "tiny.toml")
GEMM = '[workloads.g]\nop = "gemm"\nm = 64\nn = 64\nk = 64\n'
NUMS = ", ".join(str(i) for i in range(1, 1001))
CLI_EXTRAS = all(__import__("importlib").util.find_spec(m) for m in ("dask", "distributed", "pandas", "tqdm",
                                                                     "matplotlib"))


def _spec(tmp_path, body: str, head: str = "", name: str = "study.toml") -> Path:
    p = tmp_path / name
    p.write_text(f'[sweep]\ntopology = "{TINY}"\n{head}' + body)
    return p


# id: (head, body, field, fault)
BAD = {
    # -- no silent merging ---------------------------------------------------------------
    "the same value twice": ("", '[axes]\nlinks.noc.bw_gbps = [256, 256.0]\n' + GEMM,
                             "axes.links.noc.bw_gbps", "the value 256.0 is the same as 256"),
    "one path under two names": ("", '[axes]\nlinks.noc.bw_gbps = [128, 512]\n'
                                 'noc = { path = "links.noc.bw_gbps", values = [64, 32] }\n' + GEMM,
                                 "axes.noc", "sets the same entry as axes.links.noc.bw_gbps"),
    "a quoted and a dotted key": ("", '[axes]\n"links.noc.bw_gbps" = [128]\nlinks.noc.bw_gbps = [512]\n' + GEMM,
                                  "axes.links.noc.bw_gbps", "a quoted and a dotted key are the same path"),
    "a path inside another axis' path": ("", '[axes]\nnoc = { path = "links.noc", values = ["x"] }\n'
                                         'links.noc.bw_gbps = [128]\n' + GEMM, "axes.links.noc.bw_gbps", "overlaps 'links.noc' of axes.noc"),
    "path and paths": ("", '[axes]\nx = { path = "links.noc.bw_gbps", paths = ["links.hbm.bw_gbps"], '
                       'values = [1, 2] }\n' + GEMM, "axes.x", "not both"),
    "a path twice in paths": ("", '[axes]\nx = { paths = ["links.hbm.bw_gbps", "links.hbm.bw_gbps"], '
                              'scale = [1, 2] }\n' + GEMM, "axes.x.paths", "listed twice"),
    "two identical workloads": ("", GEMM + '[workloads.h]\nop = "gemm"\nm = 64\nn = 64\nk = 64\n',
                                "workloads.h", "the same run as workloads.g"),
    "a swept param value twice": ("", GEMM.replace("m = 64", "m = [64, 64]"), "workloads.g.m", "each value once"),
    "two identical points": ("", GEMM + '[[points]]\nworkload = "g"\n[[points]]\nworkload = "g"\n',
                             "points", "point 1 (g on topology 'tiny') is the same run as point 0"),
    # -- workload params, by each family's own checks, on every machine --------------------
    "a GEMM of 10^14 rows": ("", GEMM.replace("m = 64", "m = 100000000000000"), "workloads.g.m", "bytes of HBM"),
    "PEs beyond the machine": ("", GEMM + 'pes = "0-999"\n', "workloads.g.pes", "PE 8 does not exist"),
    "a negative PE": ("", GEMM + 'pes = [-1, 2]\n', "workloads.g.pes", "PE -1 does not exist"),
    "a 2-element grid": ("", GEMM + 'grid = [2, 2]\ntile = [32, 32, 32]\n', "workloads.g.grid", "three positive ints"),
    "a grid larger than the PEs": ("", GEMM + 'grid = [4, 4, 1]\ntile = [16, 16, 64]\n', "workloads.g.grid",
                                   "needs 16 PEs but the group has 8"),
    "a group named galaxy": ("", '[workloads.r]\nop = "all_reduce"\nnbytes = 4096\ngroup = "galaxy"\n',
                             "workloads.r.group", "unknown group 'galaxy'"),
    "GQA heads 3 over 2": ("", '[workloads.a]\nop = "attention"\nhq = 3\nhkv = 2\nlq = 1\nlk = 128\n',
                           "workloads.a.hq", "Hq=3 query heads are not a multiple of Hkv=2"),
    "a bad PE on one machine of the axis": (
        "", '[axes]\n"blocks.system.arrays.chip.count" = [3, 2]\n' + GEMM + 'pes = "0-11"\n',
        "workloads.g.pes",
        "PE 8 does not exist (PEs 0..7) (on topology 'tiny' with blocks.system.arrays.chip.count=2)"),
    "a machine of the axis that does not compile": (
        "", '[axes]\n"blocks.system.arrays.chip.count" = [2, 1]\n' + GEMM,
        "axes.blocks.system.arrays.chip.count", "machine.route_order: dimensions ['chip'] label no link"),
    "HBM too small on one machine of the axis": (
        "", '[axes]\n"components.hbm_slice.capacity_gib" = [1, 0.001]\n' + GEMM.replace("m = 64", "m = 200000"),
        "workloads.g.m", "components.hbm_slice.capacity_gib=0.001"),
    "an unknown vector op": ("", '[workloads.v]\nop = "vector"\nn = 64\nop_ = "add"\n', "workloads.v.op_",
                             "did you mean 'op'?"),
    "a NaN param": ("", '[workloads.v]\nop = "vector"\nn = nan\n', "workloads.v.n", "expected an int value, got nan"),
    "an op that is not a string": ("", '[workloads.v]\nop = 5\n', "workloads.v.op", "expected a string, got 5"),
    "an unknown family": ("", '[workloads.v]\nop = "gemmm"\n', "workloads.v.op", "did you mean 'gemm'?"),
    # -- axes against the topology schema after the override ---------------------------------
    "a negative bandwidth": ("", '[axes]\nlinks.noc.bw_gbps = [-1, 2]\n' + GEMM, "axes.links.noc.bw_gbps",
                             "positive number"),
    "a misspelt field": ("", '[axes]\nlinks.noc.bw_gbs = [1, 2]\n' + GEMM, "axes.links.noc.bw_gbs",
                         "did you mean 'bw_gbps'?"),
    "a scale on a string field": ("", '[axes]\nx = { path = "machine.name", scale = [2] }\n' + GEMM,
                                  "axes.x.scale", "'machine.name' is a str"),
    "a scale on a table": ("", '[axes]\nx = { path = "links.noc", scale = [2] }\n' + GEMM, "axes.x.scale",
                           "'links.noc' is a table"),
    "an infinite scale": ("", '[axes]\nx = { path = "links.noc.bw_gbps", scale = [inf] }\n' + GEMM, "axes.x.scale",
                          "finite positive numbers"),
    "an axis value that is a table": ("", '[axes]\nlinks.noc.bw_gbps = [{a = 1}]\n' + GEMM, "axes.links.noc.bw_gbps",
                                      "is a table: an axis value is a number"),
    "an axis value that is a list": ("", '[axes]\nlinks.noc.bw_gbps = [[1, 2]]\n' + GEMM, "axes.links.noc.bw_gbps",
                                     "is a list: an axis value is a number"),
    "an index into a table": ("", '[axes]\n"links.noc[0]" = [1, 2]\n' + GEMM, "axes.links.noc[0]",
                              "links.noc is not a list"),
    "one at a time into a missing element": ('combine = "one_at_a_time"\n',
                                             '[axes]\n"blocks.cube.links[99].link" = ["noc"]\n' + GEMM,
                                             "axes.blocks.cube.links[99].link", "is a list of 8"),
    "an unknown axis table field": ("", '[axes]\nx = { path = "links.noc.bw_gbps", value = [1] }\n' + GEMM,
                                    "axes.x.value", "did you mean 'values'?"),
    "a topology that is not TOML": ('', '[axes]\ntopology = ["' + TINY + '", "/etc/hostname"]\n' + GEMM,
                                    "axes.topology", "'/etc/hostname': not valid TOML"),
    "a topology that is a folder": ('', '[axes]\ntopology = ["/tmp"]\n' + GEMM, "axes.topology",
                                    "'/tmp': is a directory"),
    # -- names and code -------------------------------------------------------------------
    "a target without a colon": ("", '[workloads.f]\nfn = "os"\n', "workloads.f.fn", "expected 'module:function'"),
    "a name that escapes the plot folder": ('name = "../escaped"\n', GEMM, "sweep.name", "'../escaped'"),
    "a name that is a number": ("name = 5\n", GEMM, "sweep.name", "got 5"),
    "a hidden name": ('name = ".hidden"\n', GEMM, "sweep.name", "not starting with '.'"),
    "a target that is a string": ("", '[workloads.f]\nfn = "os:sep"\n', "workloads.f.fn",
                                  "'os:sep' is a str, not a function"),
    "a target that is a class": ("", '[workloads.f]\nfn = "collections:OrderedDict"\n', "workloads.f.fn",
                                 "is a type, not a function"),
    "a missing module": ("", '[workloads.f]\nfn = "no_such_module_25:fn"\n', "workloads.f.fn", "no_such_module_25"),
    "an unknown combine": ('combine = "product_"\n', GEMM, "sweep.combine", "did you mean 'product'?"),
    # -- bounds before work ---------------------------------------------------------------
    # NOTE: 5001 values, not 10^4: parsing 60 KB of TOML alone takes ~0.4 s on a loaded machine.
    "an axis of 5001 values, two workloads": (
        "", '[axes]\nlinks.noc.bw_gbps = [' + ", ".join(str(i) for i in range(1, 5002)) + ']\n' + GEMM
        + GEMM.replace("workloads.g", "workloads.h").replace("m = 64", "m = 32"), "sweep",
        "10002 points or more exceed the limit of 10000"),
    "an axis of 10^6 values": ("", '[axes]\nlinks.noc.bw_gbps = [' + ", ".join(map(str, range(1, 10**6))) + ']\n'
                               + GEMM, "file", "larger than 256 KiB"),
    "two axes of 1000 values": ("", f'[axes]\nlinks.noc.bw_gbps = [{NUMS}]\n"issue.fixed_cycles" = [{NUMS}]\n' + GEMM,
                                "sweep", "1000000 points or more exceed the limit"),
    "1000 params x 1000 values": ("", '[workloads.f]\nfn = "os:getenv"\n'
                                  + "".join(f"p{i} = [{NUMS}]\n" for i in range(1000)), "file", "larger than 256 KiB"),
    "100 params x 2 values": ("", '[workloads.f]\nfn = "json:dumps"\n'
                              + "".join(f"p{i} = [1, 2]\n" for i in range(100)), "sweep", "exceed the limit"),
    "3000 nested tables": ("", '[axes]\n' + 'a.' * 3000 + 'b = [1]\n' + GEMM, "line 4", "nested more than 16 levels"),
    "3000 nested lists": ("", '[axes]\nx = ' + '[' * 3000 + ']' * 3000 + '\n' + GEMM, "file", "nested too deeply"),
    "20 nested inline tables": ("", '[axes]\nx = ' + '{a = ' * 20 + '1' + '}' * 20 + '\n' + GEMM, "axes.x" + ".a" * 15,
                                "nested more than 16 levels"),
}


def _refused(path):
    t0 = time.perf_counter()
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return str(info.value), time.perf_counter() - t0


@pytest.mark.parametrize("head, body, field, fault", BAD.values(), ids=BAD.keys())
def test_bad_spec_is_refused_naming_the_field(tmp_path, head, body, field, fault):
    message, elapsed = _refused(_spec(tmp_path, body, head))
    assert message.startswith(f"study.toml: {field}: "), message
    assert fault in message, message
    assert elapsed < 1.0, f"refused in {elapsed:.2f} s"


def _store(tmp_path) -> tuple[Path, bytes]:
    """A store file with one row, and its bytes."""
    path = tmp_path / "kept.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE kept (x TEXT)")
        db.execute("INSERT INTO kept VALUES ('row')")
    return path, path.read_bytes()


def _cli_refuses(capsys, argv, fault) -> str:
    t0 = time.perf_counter()
    assert main(argv) == 2
    elapsed = time.perf_counter() - t0
    out, err = capsys.readouterr()
    assert err.startswith("kbtorch: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert fault in err, err
    assert elapsed < 1.0, f"refused in {elapsed:.2f} s"
    return err


@pytest.mark.skipif(not CLI_EXTRAS, reason="needs the [sweep] extra")
@pytest.mark.parametrize("head, body, field, fault", BAD.values(), ids=BAD.keys())
def test_cli_refuses_and_leaves_the_store(tmp_path, capsys, head, body, field, fault):
    spec = _spec(tmp_path, body, head)
    store, before = _store(tmp_path)
    _cli_refuses(capsys, ["sweep", str(spec), "--workers", "1", "--store", str(store)], f"study.toml: {field}: ")
    assert store.read_bytes() == before and not (tmp_path / "study.sqlite").exists()


# -- limits from the environment --------------------------------------------------------------

FOUR = '[axes]\nlinks.noc.bw_gbps = [128, 256]\n' + GEMM + 'composite = [true, false]\n'


def test_points_limit_is_exact(tmp_path, monkeypatch):
    spec = _spec(tmp_path, FOUR)
    monkeypatch.setenv("KBTORCH_MAX_POINTS", "4")
    assert len(load_spec(spec).points) == 4
    monkeypatch.setenv("KBTORCH_MAX_POINTS", "3")
    message, elapsed = _refused(spec)
    assert "4 points or more exceed the limit of 3 (set KBTORCH_MAX_POINTS" in message and elapsed < 1.0


def test_points_limit_counts_explicit_points(tmp_path, monkeypatch):
    monkeypatch.setenv("KBTORCH_MAX_POINTS", "5")
    points = "".join(f'[[points]]\nworkload = "g"\n"issue.fixed_cycles" = {c}\n' for c in (80, 81, 82))
    spec = _spec(tmp_path, GEMM + 'composite = [true, false]\n' + points)
    message, _ = _refused(spec)
    assert "6 points or more exceed the limit of 5" in message


@pytest.mark.parametrize("variable", ["KBTORCH_MAX_POINTS", "KBTORCH_MAX_DEPTH"])
@pytest.mark.parametrize("value", ["abc", "-1", "0", "1e3", "0x10", "١٢", "", "12.5"])
def test_garbage_limits_are_refused(tmp_path, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    message, elapsed = _refused(_spec(tmp_path, FOUR))
    assert message.startswith("study.toml: environment: ") and f"${variable}={value!r}" in message
    assert "positive integer" in message and elapsed < 1.0


# -- scheduler, exit status, outputs ------------------------------------------------------------

def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not CLI_EXTRAS, reason="needs the [sweep] extra")
@pytest.mark.parametrize("address, fault", [
    ("tcp://127.0.0.1:{port}", "cannot reach the Dask scheduler at 'tcp://127.0.0.1:{port}' within 3 s"),
    ("nowhere", "'nowhere' is not a Dask scheduler address"),
    ("tcp://127.0.0.1:99999", "is not a Dask scheduler address"),
])
def test_unreachable_scheduler_is_named_at_once(tmp_path, capsys, address, fault):
    port = _closed_port()
    spec = _spec(tmp_path, GEMM)
    _cli_refuses(capsys, ["sweep", str(spec), "--scheduler", address.format(port=port)], fault.format(port=port))
    assert not (tmp_path / "study.sqlite").exists()


HELPER = '''
def boom(machine, n=1):
    raise RuntimeError(f"no luck with {n}")


def fine(machine, n=1):
    return {"latency_ns": float(n), "bottleneck": "none"}
'''


@pytest.mark.skipif(not CLI_EXTRAS, reason="needs the [sweep] extra")
def test_failed_points_exit_1_with_a_summary_by_cause(tmp_path, capsys):
    (tmp_path / "helper25.py").write_text(HELPER)
    spec = _spec(tmp_path, '[workloads.b]\nfn = "helper25:boom"\nn = [1, 2]\n[workloads.c]\nfn = "helper25:boom"\n'
                 'n = 3\n[workloads.ok]\nfn = "helper25:fine"\n')
    assert main(["sweep", str(spec), "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert "3 of 4 points failed, by cause:" in out
    assert "1 x RuntimeError: no luck with 1 (workloads: b)" in out and "no luck with 3 (workloads: c)" in out
    assert main(["sweep", str(spec), "--workers", "1", "--json"]) == 1      # stored failures count too
    data = json.loads(capsys.readouterr().out)
    assert sorted(c["points"] for c in data["causes"]) == [1, 1, 1] and len(data["failed"]) == 3


@pytest.mark.skipif(not CLI_EXTRAS, reason="needs the [sweep] extra")
@pytest.mark.parametrize("option, target, fault", [
    ("--export", "missing/dir/out.csv", "no directory"),
    ("--export", ".", "is a directory"),
    ("--plot", "spec_as_dir", "is not a directory"),
])
def test_unwritable_outputs_are_refused_before_any_point(tmp_path, capsys, option, target, fault):
    spec = _spec(tmp_path, GEMM)
    (tmp_path / "spec_as_dir").write_text("a file")
    argv = ["sweep", str(spec), "--workers", "1", option] + (["csv"] if option == "--export" else [])
    _cli_refuses(capsys, argv + [str(tmp_path / target)], fault)
    assert not (tmp_path / "study.sqlite").exists()


@pytest.mark.skipif(not CLI_EXTRAS or os.geteuid() == 0, reason="needs the [sweep] extra and a non-root user")
def test_read_only_plot_folder_is_refused(tmp_path, capsys):
    spec = _spec(tmp_path, GEMM)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    _cli_refuses(capsys, ["sweep", str(spec), "--workers", "1", "--plot", str(locked / "plots")], "is not writable")


@pytest.mark.skipif(not CLI_EXTRAS, reason="needs the [sweep] extra")
def test_a_sweep_writes_only_its_named_outputs(tmp_path, capsys):
    (tmp_path / "helper25.py").write_text(HELPER)
    spec = _spec(tmp_path, '[axes]\n"../../up" = { path = "links.noc.bw_gbps", values = [128, 256] }\n'
                 '"issue.fixed_cycles" = [40, 80]\n[workloads.ok]\nfn = "helper25:fine"\n', name="study.v2.toml")
    before = {p for p in tmp_path.parent.rglob("*")}
    out = tmp_path / "out"
    out.mkdir()
    assert main(["sweep", str(spec), "--workers", "1", "--store", str(out / "s.sqlite"), "--export", "md",
                 str(out / "t.md"), "--plot", str(out / "plots")]) == 0
    capsys.readouterr()
    made = {p for p in tmp_path.parent.rglob("*")} - before - {out}
    assert all(out in p.parents for p in made), sorted(map(str, made))
    plots = sorted(p.name for p in (out / "plots").iterdir())
    assert plots == ["study_v2_______up.png", "study_v2_heatmap.png", "study_v2_issue_fixed_cycles.png",
                     "study_v2_sensitivity.png"]


# -- code named by a spec -----------------------------------------------------------------------

@pytest.mark.skipif(not CLI_EXTRAS, reason="needs the [sweep] extra")
def test_a_dask_py_beside_the_spec_shadows_nothing(tmp_path):
    import subprocess
    folder = tmp_path / "spec"
    folder.mkdir()
    (folder / "dask.py").write_text("raise SystemExit('the spec folder dask.py was imported')\n")
    (folder / "helper25.py").write_text(HELPER)
    spec = _spec(folder, '[workloads.ok]\nfn = "helper25:fine"\nn = [1, 2]\n')
    (tmp_path / "work").mkdir()
    root = str(Path(__file__).resolve().parents[1])
    code = f"import sys; sys.path.insert(0, {root!r}); from kbtorch.cli import main; sys.exit(main())"
    run = subprocess.run([sys.executable, "-c", code, "sweep", str(spec), "--workers", "2", "--json"],
                         capture_output=True, text=True, cwd=tmp_path / "work", timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)["points"] == 2 and "spec folder dask.py" not in run.stderr


def test_a_module_hidden_by_an_installed_one_is_refused(tmp_path):
    (tmp_path / "json.py").write_text("def dumps(machine):\n    return {'latency_ns': 1.0}\n")
    message, elapsed = _refused(_spec(tmp_path, '[workloads.f]\nfn = "json:dumps"\n'))
    assert message.startswith("study.toml: workloads.f.fn: ") and "'json' is the installed module" in message
    assert "rename it" in message and elapsed < 1.0
