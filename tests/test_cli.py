"""The kbtorch command line, run in-process, and the unit parsers it relies on."""
import json
import subprocess
import sys

import pytest

from kbtorch.cli import main
from kbtorch.sim.traffic import pattern_pairs
from kbtorch.topology import load_machine
from kbtorch.units import fmt_bytes, parse_bytes, parse_pe, parse_pes


@pytest.mark.parametrize("text, expected", [
    ("4096", 4096), ("4KiB", 4096), ("1MiB", 1 << 20), ("2GiB", 2 << 30), ("1.5MiB", 3 << 19),
    ("64KB", 64000), ("3 mb", 3_000_000), ("1GB", 10**9), ("256B", 256), (512, 512),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["-4", "4XiB", "abc", "", "1.5", "0.1KiB", "1e6"])
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError, match=repr(text) if text else "invalid"):
        parse_bytes(text)


def test_parse_bytes_minimum():
    with pytest.raises(ValueError, match="at least 1"):
        parse_bytes("0", minimum=1)


def test_parse_pes():
    assert parse_pes("0,5,9") == [0, 5, 9]
    assert parse_pes("0-7") == list(range(8))
    assert parse_pes("0-3, 8", n_pes=16) == [0, 1, 2, 3, 8]
    assert parse_pe("7", n_pes=8) == 7


@pytest.mark.parametrize("text, message", [
    ("0,300", "PE 300 does not exist"), ("250-260", "PE 256 does not exist"), ("1,x", "'x'"),
    ("5-2", "backwards"), ("1,1", "PE 1 is listed twice"), ("", "invalid PE list"),
])
def test_parse_pes_rejects(text, message):
    with pytest.raises(ValueError, match=message):
        parse_pes(text, n_pes=256)


def test_fmt_bytes():
    assert [fmt_bytes(n) for n in (1 << 20, 3 << 19, 4096, 1000)] == ["1 MiB", "1.5 MiB", "4 KiB", "1000 B"]


def test_topo_json(cli_json):
    s = cli_json("topo")
    assert s["pes"] == 256 and s["peak_tflops"]["f16"] == pytest.approx(2048)
    assert s["hbm_gbps_total"] == pytest.approx(32 * 1024)
    assert {"nodes_by_kind", "edges_by_kind", "links", "hbm_gib_total", "sram_mib_total"} <= set(s)


def test_topo_text_and_path(tiny_path, capsys):
    assert main(["topo", str(tiny_path)]) == 0
    out = capsys.readouterr().out
    assert "TFLOP/s" in out and "node kind" in out and "tiny" in out


@pytest.mark.parametrize("module", ["kbtorch", "kbtorch.cli"])
def test_runs_as_a_module(module, tiny_path, tmp_path):
    """``python -m kbtorch`` (no console script on PATH) is the same command; so is ``-m kbtorch.cli``."""
    out = subprocess.run([sys.executable, "-m", module, "topo", str(tiny_path), "--json"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["pes"] == len(load_machine(str(tiny_path)).pes)
    bad = subprocess.run([sys.executable, "-m", module, "topo", "no_such_machine"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "no_such_machine" in bad.stderr


def test_default_shows_machine_and_example(cli_json):
    data = cli_json()
    assert data["topology"]["pes"] == 256
    example = data["example"]
    assert (example["src"], example["dst"], example["bytes"]) == (0, 255, 1 << 20)
    assert example["latency_ns"] > 0


def test_transfer_json(cli_json):
    d = cli_json("bench", "transfer", "--src", "0", "--dst", "255", "--bytes", "64KiB")
    assert {"latency_ns", "gbps", "path", "breakdown", "events", "wall_s"} <= set(d)
    assert d["path"][0] == "sip0.cube0.hs0" and d["path"][-1].endswith("hs7")
    assert d["gbps"] == pytest.approx(65536 / d["latency_ns"])
    assert sum(d["breakdown"].values()) == pytest.approx(d["latency_ns"])


def test_transfer_latency_grows_with_bytes(cli_json):
    lat = [cli_json("bench", "transfer", "--src", "3", "--dst", "40", "--bytes", n)["latency_ns"]
           for n in ("4KiB", "16KiB", "64KiB")]
    assert lat[0] < lat[1] < lat[2]


def test_transfer_flit_exact_close_to_fast(cli_json):
    argv = ("bench", "transfer", "--src", "0", "--dst", "9", "--bytes", "32KiB")
    fast = cli_json(*argv)["latency_ns"]
    exact = cli_json(*argv, "--flit-exact")["latency_ns"]
    assert exact == pytest.approx(fast, rel=0.05)


def test_transfer_text(capsys):
    assert main(["bench", "transfer", "--src", "0", "--dst", "1", "--bytes", "4KiB"]) == 0
    out = capsys.readouterr().out
    assert "GB/s" in out and "hop" in out and "HBM channel" in out and "total" in out


def test_json_flag_before_command(capsys):
    assert main(["--json", "bench", "transfer", "--src", "0", "--dst", "1", "--bytes", "4KiB"]) == 0
    assert json.loads(capsys.readouterr().out)["bytes"] == 4096


@pytest.mark.parametrize("pes, pattern, lo, hi", [
    ("0-7", "uniform", 900, 1030), ("0-7", "hot-channel", 240, 260),
    ("0", "uniform", 230, 260), ("0", "hot-channel", 30, 33),
])
def test_bench_hbm_bandwidth(pes, pattern, lo, hi, cli_json):
    d = cli_json("bench", "hbm", "--pes", pes, "--bytes", "256KiB", "--pattern", pattern)
    launch = max(d["launch_ns"].values())
    assert lo <= d["gbps"] * d["latency_ns"] / (d["latency_ns"] - launch) <= hi        # from the last launch
    assert all(lo / len(d["pes"]) <= g <= hi for g in d["per_pe_gbps"].values())
    assert 0 < launch < 200                                                            # the kernel launch
    assert set(d["per_pe_gbps"]) == {str(p) for p in parse_pes(pes)}
    assert {"latency_ns", "events", "wall_s"} <= set(d)


def test_bench_traffic_json(cli_json):
    argv = ("bench", "traffic", "--pattern", "hotspot", "--messages", "12", "--bytes", "4KiB", "--seed", "3")
    d = cli_json(*argv)
    pairs = [(m["src"], m["dst"]) for m in d["messages"]]
    assert pairs == pattern_pairs("hotspot", 256, 12, 3)
    assert d["latency_ns"] == pytest.approx(max(m["finish_ns"] for m in d["messages"]))
    assert {"events", "wall_s"} <= set(d)


def test_bench_writes_trace(tmp_path):
    path = tmp_path / "trace.tsv"
    assert main(["bench", "hbm", "--pes", "2", "--bytes", "4KiB", "--trace", str(path)]) == 0
    lines = path.read_text().splitlines()
    assert lines[0].startswith("#") and len(lines) > 3 and "sip0.cube0.pe2" in path.read_text()


@pytest.mark.parametrize("argv, named", [
    (["--topology", "no-such-topo", "topo"], "no-such-topo"),
    (["topo", "missing/file.toml"], "missing/file.toml"),
    (["bench", "transfer", "--src", "0", "--dst", "300", "--bytes", "4KiB"], "PE 300"),
    (["bench", "transfer", "--src", "4", "--dst", "4"], "PE 4"),
    (["bench", "transfer", "--src", "0", "--dst", "1", "--bytes", "12XB"], "12XB"),
    (["bench", "hbm", "--bytes", "-5"], "-5"),
    (["bench", "hbm", "--pattern", "zigzag"], "zigzag"),
    (["bench", "hbm", "--pes", "0,300"], "PE 300"),
    (["bench", "hbm", "--pes", "0", "--bytes", "16MiB"], "TCM"),
    (["bench", "traffic", "--pattern", "zigzag"], "zigzag"),
    (["bench", "traffic", "--messages", "0"], "--messages"),
    (["bench", "nope"], "nope"),
])
def test_errors_exit_2_naming_the_argument(argv, named, cli_error):
    assert named in cli_error(*argv)
