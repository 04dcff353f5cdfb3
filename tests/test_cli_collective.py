"""``kbtorch bench allreduce|allgather|reducescatter|broadcast``: JSON, text, --check, errors."""
import importlib

import pytest

from kbtorch.cli import main
from kbtorch.topology import load_machine

CUBE_RING = ("bench", "allreduce", "--bytes", "64KiB", "--group", "cube", "--algo", "ring")
SMALL_RING = ("bench", "allreduce", "--bytes", "8KiB", "--group", "cube", "--algo", "ring")
KEYS = {"collective", "algo", "op", "members", "bytes", "dtype", "mode", "latency_ns", "algbw_gbps", "busbw_gbps",
        "bound_ns", "pct_bound", "startup_ns", "bottleneck", "analytic_ns", "candidates_ns", "events", "wall_s"}


@pytest.fixture(scope="module", autouse=True)
def machines(ahbm):
    """Compile the topologies and import torch once, outside the timed tests."""
    importlib.import_module("kbtorch.ops.collective")
    return ahbm, load_machine("torus6")


def test_allreduce_json_keys_and_figures(cli_json):
    d = cli_json(*CUBE_RING)
    assert KEYS <= set(d) and "allclose" not in d
    assert (d["collective"], d["algo"], d["members"], d["bytes"], d["dtype"]) == ("all_reduce", "ring", 8, 65536, "f16")
    assert d["latency_ns"] > 0 and d["events"] > 0 and d["wall_s"] > 0 and d["analytic_ns"] > 0
    assert d["algbw_gbps"] == pytest.approx(65536 / d["latency_ns"])
    assert d["busbw_gbps"] == pytest.approx(d["algbw_gbps"] * 2 * 7 / 8, rel=1e-9)
    assert 0 < d["startup_ns"] <= d["bound_ns"] and 0 < d["pct_bound"] <= 100.5
    assert d["pct_bound"] == pytest.approx(100 * d["bound_ns"] / d["latency_ns"])
    assert d["candidates_ns"] == {} and d["bottleneck"]


def test_text_report(capsys):
    assert main([*SMALL_RING, "--check"]) == 0
    out = capsys.readouterr().out
    for word in ("all_reduce", "ring", "members", "8", "8 KiB", " us", "algbw", "busbw", "GB/s", "bound",
                 "startup bound", "bottleneck", "alpha-beta", "events", "wall", "max abs err", "allclose yes"):
        assert word in out, word


@pytest.mark.parametrize("argv", [
    ("allreduce", "--group", "cube", "--algo", "ring", "--bytes", "16KiB"),
    ("allreduce", "--group", "cube", "--algo", "tree", "--bytes", "4KiB"),
    ("allreduce", "--group", "cube", "--algo", "2d", "--bytes", "4KiB", "--op", "max", "--dtype", "bf16"),
    ("allgather", "--group", "cube", "--bytes", "16KiB"),
    ("reducescatter", "--group", "cube", "--bytes", "16KiB", "--dtype", "fp32"),
    ("broadcast", "--group", "cube", "--bytes", "16KiB", "--root", "3"),
])
def test_check_matches_torch(argv, cli_json):
    d = cli_json("bench", *argv, "--check")
    assert d["allclose"] is True and 0 <= d["max_abs_err"] <= d["atol"]
    assert d["atol"] == pytest.approx((1e-5 if "fp32" in argv else 1e-2) * 8)
    if argv[0] in ("allgather", "broadcast"):
        assert d["max_abs_err"] == 0
    if argv[0] == "broadcast":
        assert d["root"] == 3


def test_check_does_not_change_the_timing(cli_json):
    timing = cli_json(*SMALL_RING)
    checked = cli_json(*SMALL_RING, "--check")
    assert checked["latency_ns"] == timing["latency_ns"] and checked["allclose"] is True


def test_auto_picks_the_best_estimate(cli_json):
    d = cli_json("bench", "allreduce", "--group", "cube", "--bytes", "1KiB")
    cands = d["candidates_ns"]
    assert {"ring", "tree"} <= set(cands) and d["algo"] in cands
    assert cands[d["algo"]] == min(cands.values()) and d["analytic_ns"] == cands[d["algo"]]


def test_auto_text_lists_the_estimates(capsys):
    assert main(["bench", "allreduce", "--group", "cube", "--bytes", "1KiB"]) == 0
    out = capsys.readouterr().out
    assert "auto; estimates:" in out and "ring" in out and "tree" in out


def test_torus6_group(cli_json):
    d = cli_json("bench", "allreduce", "--topology", "torus6", "--group", "0,8,16,24,32,40", "--bytes", "12KiB",
                 "--check")
    assert d["topology"] == "torus6" and d["members"] == 6 and d["latency_ns"] > 0 and d["allclose"] is True
    assert d["busbw_gbps"] == pytest.approx(d["algbw_gbps"] * 2 * 5 / 6, rel=1e-9)


def test_bus_factors(cli_json):
    common = ("--group", "cube", "--bytes", "16KiB", "--algo", "ring")
    for name, factor in (("allgather", 7 / 8), ("reducescatter", 7 / 8), ("broadcast", 1)):
        d = cli_json("bench", name, *common)
        assert d["busbw_gbps"] == pytest.approx(d["algbw_gbps"] * factor, rel=1e-9), name


def test_options_reach_the_run(cli_json):
    d = cli_json("bench", "reducescatter", "--group", "cube:3", "--bytes", "32KiB", "--algo", "direct",
                 "--dtype", "fp32", "--op", "max", "--mode", "flit", "--packet-bytes", "2KiB")
    assert (d["algo"], d["dtype"], d["op"], d["mode"], d["group"]) == ("direct", "fp32", "max", "flit", "cube:3")


@pytest.mark.parametrize("argv, named", [
    (("allreduce", "--bytes", "1KiB", "--group", "5"), "argument --group: a collective needs at least two members"),
    (("allreduce", "--bytes", "1KiB", "--group", "0,300"), "argument --group: PE 300 is outside"),
    (("allreduce", "--bytes", "1KiB", "--group", "nowhere"), "argument --group: unknown group 'nowhere'"),
    (("reducescatter", "--group", "cube", "--bytes", "1000", "--algo", "ring"), "argument --bytes: 1000 bytes"),
    (("allreduce", "--group", "cube", "--bytes", "1001"), "argument --bytes: 1001 bytes"),
    (("allgather", "--group", "cube", "--bytes", "1000"), "argument --bytes"),
    (("reducescatter", "--group", "0-5", "--algo", "tree", "--bytes", "12KiB"), "argument --algo: algorithm 'tree'"),
    (("broadcast", "--bytes", "1KiB", "--group", "cube", "--root", "8"), "argument --root: 8"),
    (("allreduce", "--group", "cube", "--bytes", "64KiB", "--packet-bytes", "1GiB"), "argument --packet-bytes"),
    (("allreduce", "--bytes", "0"), "--bytes"),
    (("allreduce", "--group", "cube"), "--bytes"),
    (("allreduce", "--bytes", "1KiB", "--algo", "ring2"), "--algo"),
    (("allreduce", "--bytes", "1KiB", "--dtype", "f64"), "--dtype"),
    (("allgather", "--bytes", "1KiB", "--root", "1"), "--root"),
    (("broadcast", "--bytes", "1KiB", "--op", "max"), "--op"),
])
def test_errors_exit_2_naming_the_argument(argv, named, cli_error):
    assert named in cli_error("bench", *argv)
