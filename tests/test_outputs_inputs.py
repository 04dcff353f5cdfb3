"""Issue 45: outputs never overwrite inputs (the store, the spec, a topology or chip file, a
file of another kind), and results are keyed by the content of every file they read (an edit
to a system's chip file is a new machine in the same process)."""
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from kbtorch.cli import main
from kbtorch.topology.machine import Machine, load_machine

DATA = Path(__file__).parent / "data"
CLI_EXTRAS = all(__import__("importlib").util.find_spec(m) for m in ("dask", "distributed", "pandas", "tqdm",
                                                                     "matplotlib"))
GEMM = '[workloads.g]\nop = "gemm"\nm = 64\nn = 64\nk = 64\n'


def _system(tmp_path) -> Path:
    """tiny_system and its chip file copied into tmp_path."""
    shutil.copy(DATA / "tiny_system.toml", tmp_path / "sys.toml")
    shutil.copy(DATA / "tinychip.toml", tmp_path / "tinychip.toml")
    return tmp_path / "sys.toml"


def _spec(tmp_path) -> Path:
    spec = tmp_path / "study.toml"
    spec.write_text(f'[sweep]\ntopology = "{_system(tmp_path)}"\n' + GEMM)
    return spec


def _refused(capsys, argv, fault) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.startswith("kbtorch: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert fault in err, err


def _bytes(paths) -> dict:
    return {p: Path(p).read_bytes() for p in paths if Path(p).exists()}


@pytest.mark.skipif(not CLI_EXTRAS, reason="needs the [sweep] extra")
@pytest.mark.parametrize("target, fmt, fault", [
    ("st.sqlite", "csv", "is the sweep's store"),
    ("study.toml", "csv", "is the sweep spec"),
    ("sys.toml", "md", "is the topology file sys.toml"),
    ("tinychip.toml", "csv", "is the chip file tinychip.toml of the system sys.toml"),
    ("other.sqlite", "csv", "exists and is an SQLite database, not a csv file as --export"),
    ("old.csv", "md", "exists and is a CSV export of a sweep, not a md file as --export"),
    ("notes.txt", "md", "exists and is a file of another kind"),
])
def test_export_never_overwrites_an_input(tmp_path, capsys, target, fmt, fault):
    spec = _spec(tmp_path)
    store = tmp_path / "st.sqlite"
    sqlite3.connect(tmp_path / "other.sqlite").execute("CREATE TABLE t (x)").connection.commit()
    (tmp_path / "old.csv").write_text("key,workload\n")
    (tmp_path / "notes.txt").write_text("my notes\n")
    before = _bytes(tmp_path.iterdir())
    _refused(capsys, ["sweep", str(spec), "--workers", "1", "--store", str(store), "--export", fmt,
                      str(tmp_path / target)], fault)
    assert _bytes(tmp_path.iterdir()) == before and not store.exists()


@pytest.mark.skipif(not CLI_EXTRAS, reason="needs the [sweep] extra")
def test_export_overwrites_its_own_kind(tmp_path, capsys):
    spec = _spec(tmp_path)
    out = tmp_path / "out.csv"
    for _ in range(2):
        assert main(["sweep", str(spec), "--workers", "1", "--export", "csv", str(out)]) == 0
        capsys.readouterr()
    assert out.read_text().startswith("key,workload")


@pytest.mark.skipif(not CLI_EXTRAS, reason="needs the [sweep] extra")
@pytest.mark.parametrize("target, fault", [
    ("sys.toml", "is the topology file sys.toml the sweep reads"),
    ("tinychip.toml", "is the chip file tinychip.toml the sweep reads"),
    ("study.toml", "is the sweep spec itself"),
])
def test_store_is_never_an_input(tmp_path, capsys, target, fault):
    spec = _spec(tmp_path)
    before = _bytes(tmp_path.iterdir())
    _refused(capsys, ["sweep", str(spec), "--workers", "1", "--store", str(tmp_path / target)], fault)
    assert _bytes(tmp_path.iterdir()) == before


@pytest.mark.skipif(not CLI_EXTRAS, reason="needs the [sweep] extra")
def test_plot_never_overwrites_an_input(tmp_path, capsys):
    spec = _spec(tmp_path)
    store = tmp_path / "study_points.png"
    _refused(capsys, ["sweep", str(spec), "--workers", "1", "--store", str(store), "--plot", str(tmp_path)],
             "a plot of that name would replace it")
    assert not store.exists()


@pytest.mark.parametrize("target, fault", [
    ("sys.toml", "is the topology file sys.toml the run reads"),
    ("tinychip.toml", "is the chip file tinychip.toml"),
    ("other.sqlite", "exists and is an SQLite database, not a trace file as --trace"),
])
def test_trace_never_overwrites_an_input(tmp_path, capsys, target, fault):
    system = _system(tmp_path)
    sqlite3.connect(tmp_path / "other.sqlite").execute("CREATE TABLE t (x)").connection.commit()
    before = _bytes(tmp_path.iterdir())
    _refused(capsys, ["bench", "transfer", "--topology", str(system), "--src", "0", "--dst", "5",
                      "--bytes", "4KiB", "--trace", str(tmp_path / target)], fault)
    assert _bytes(tmp_path.iterdir()) == before


def test_trace_overwrites_a_trace(tmp_path, capsys):
    trace = tmp_path / "t.tsv"
    for _ in range(2):
        assert main(["bench", "transfer", "--topology", str(DATA / "tiny.toml"), "--src", "0", "--dst", "1",
                     "--bytes", "4KiB", "--trace", str(trace)]) == 0
    capsys.readouterr()
    assert trace.read_text().startswith("# start_ps")


def _noc_gbps(machine) -> set:
    return {v["bw_gbps"] for k, v in machine.summary()["links"].items() if k.startswith("noc")}


def test_an_edit_to_a_chip_file_is_a_new_machine(tmp_path):
    system = _system(tmp_path)
    chip = tmp_path / "tinychip.toml"
    old = load_machine(str(system))
    text = chip.read_text()
    first = _noc_gbps(old)
    assert len(first) == 1
    (gbps,) = first
    edited = text.replace(f"bw_gbps = {gbps:g}", "bw_gbps = 8", 1)
    assert edited != text
    chip.write_text(edited)
    os.utime(chip, ns=(1, 1))           # NOTE: even with an older mtime
    new = load_machine(str(system))
    assert new is not old and new.digest != old.digest and 8.0 in _noc_gbps(new)
    assert 8.0 in _noc_gbps(Machine(str(system)))
    chip.write_text(text)
    assert load_machine(str(system)).digest == old.digest


@pytest.mark.skipif(not CLI_EXTRAS, reason="needs the [sweep] extra")
def test_a_sweep_runs_again_after_an_edit_to_a_chip_file(tmp_path):
    from kbtorch.sweep.runner import execute
    spec = _spec(tmp_path)
    chip = tmp_path / "tinychip.toml"
    first = execute(spec, workers=1, progress=False)
    text = chip.read_text()
    chip.write_text(text.replace("noc = { kind = \"noc\", bw_gbps = 256", "noc = { kind = \"noc\", bw_gbps = 8", 1))
    second = execute(spec, workers=1, progress=False)
    assert first.ran == 1 and second.ran == 1 and second.reused == 0
    assert second.rows[0]["key"] != first.rows[0]["key"]
    assert second.rows[0]["latency_ns"] > first.rows[0]["latency_ns"]


def test_cli_honours_kbtorch_topology(monkeypatch, capsys):
    """$KBTORCH_TOPOLOGY chooses the CLI's machine where no --topology is given; an unknown
    name is refused by name (it was ignored: rc 0 on ahbm)."""
    monkeypatch.setenv("KBTORCH_TOPOLOGY", "no_such_machine")
    _refused(capsys, ["topo"], "$KBTORCH_TOPOLOGY='no_such_machine'")
    monkeypatch.setenv("KBTORCH_TOPOLOGY", "maia200")
    assert main(["topo", "--json"]) == 0
    assert '"maia200"' in capsys.readouterr().out
    assert main(["topo", "--json", "--topology", "ahbm"]) == 0
    assert '"maia200"' not in capsys.readouterr().out
