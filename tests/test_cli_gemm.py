"""``kbtorch bench gemm``: the report, its JSON, the tiling options, --check and bad input."""
import math

import pytest

from kbtorch.cli import main
from kbtorch.cli_gemm import _square_grid

SMALL = ("bench", "gemm", "--m", "256", "--n", "256", "--k", "256", "--pes", "0-7")
ODD = ("bench", "gemm", "--m", "100", "--n", "70", "--k", "50", "--pes", "0-7")
KEYS = {"latency_ns", "tflops", "pct_peak", "analytic_ns", "analytic_pct_peak", "hbm_gbps", "pct_hbm", "tiling",
        "composite", "events", "wall_s"}


def test_json_keys_and_figures(cli_json):
    d = cli_json(*SMALL)
    assert KEYS <= set(d)
    assert (d["m"], d["n"], d["k"], d["dtype"]) == (256, 256, 256, "f16")
    assert d["latency_ns"] > 0 and d["analytic_ns"] > 0 and d["events"] > 0 and d["wall_s"] > 0
    assert d["composite"] is True and d["timing_only"] is True and "allclose" not in d
    gm, gn, gk = d["tiling"]["grid"]
    assert len(d["tiling"]["tile"]) == 3 and gm * gn * gk == d["pes_used"] <= 8
    assert d["pes"] == list(range(d["pes_used"]))
    assert d["tflops"] == pytest.approx(2 * 256**3 / d["latency_ns"] / 1000)
    assert d["peak_tflops"] == pytest.approx(8 * d["pes_used"])             # 8 TFLOP/s f16 per PE
    assert d["pct_peak"] == pytest.approx(100 * d["tflops"] / d["peak_tflops"])
    assert d["analytic_pct_peak"] == pytest.approx(100 * 2 * 256**3 / d["analytic_ns"] / 1000 / d["peak_tflops"])
    assert d["hbm_gbps"] == pytest.approx(d["hbm_bytes"] / d["latency_ns"])
    assert d["pct_hbm"] == pytest.approx(100 * d["hbm_gbps"] / d["hbm_gbps_peak"])
    assert 0 < d["pct_peak"] <= 100 and 0 < d["pct_hbm"] <= 100
    assert d["analytic_bound"] in ("compute", "DMA", "TCM")
    # every byte of A and B is read at least once, C written once
    assert d["hbm_bytes"] >= (256 * 256 * 3) * 2
    gemm_engine = d["engines"]["gemm"]
    assert gemm_engine["pes"] == d["pes_used"] and gemm_engine["commands"] >= d["pes_used"]
    assert gemm_engine["busy_pct"] == pytest.approx(
        100 * gemm_engine["busy_ps"] / (d["latency_ns"] * 1000 * gemm_engine["pes"]))
    assert all(0 <= e["busy_pct"] <= 100 for e in d["engines"].values())
    assert sum(d["breakdown"].values()) == pytest.approx(d["latency_ns"])


def test_text_report(capsys):
    assert main(list(SMALL)) == 0
    out = capsys.readouterr().out
    for word in ("256x256x256", "TFLOP/s", "% of", "analytic estimate", "-bound", "GB/s", "tiling", "grid",
                 "engine", "busy %", "timing only", "total"):
        assert word in out, word


def test_help_says_timing_only_by_default(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "gemm", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "timing-only" in out and "--check" in out and "torch.matmul" in out


def test_odd_shape(cli_json):
    d = cli_json(*ODD)
    assert d["latency_ns"] > 0 and d["tflops"] == pytest.approx(2 * 100 * 70 * 50 / d["latency_ns"] / 1000)
    grid, tile = d["tiling"]["grid"], d["tiling"]["tile"]
    assert grid[0] <= 100 and grid[1] <= 70 and grid[2] <= 50 and min(tile) >= 1


@pytest.mark.parametrize("dtype", ["f16", "bf16", "fp32"])
def test_check_allclose_each_dtype(dtype, cli_json):
    d = cli_json(*SMALL, "--dtype", dtype, "--check")
    assert d["dtype"] == dtype and d["timing_only"] is False
    assert d["allclose"] is True and 0 <= d["max_abs_err"] <= d["atol"]


@pytest.mark.parametrize("extra", [(), ("--grid", "2,2,2"), ("--no-composite",)])
def test_check_odd_shape(extra, cli_json):
    d = cli_json(*ODD, "--check", *extra)
    assert d["allclose"] is True


def test_check_and_timing_only_give_the_same_latency(cli_json):
    timing = cli_json(*ODD)
    checked = cli_json(*ODD, "--check")
    assert checked["latency_ns"] == timing["latency_ns"] and checked["tiling"] == timing["tiling"]


@pytest.mark.parametrize("argv", [
    ("bench", "gemm", "--m", "512", "--n", "512", "--k", "512", "--pes", "0-7"),
    ("bench", "gemm", "--m", "256", "--n", "256", "--k", "256", "--pes", "0-7", "--tile", "64,64,64"),
    ODD,
])
def test_no_composite_is_not_faster(argv, cli_json):
    composite = cli_json(*argv)
    chained = cli_json(*argv, "--no-composite")
    assert chained["composite"] is False and chained["tiling"] == composite["tiling"]
    assert chained["latency_ns"] >= composite["latency_ns"]
    assert {"dma_rd", "dma_wr", "gemm"} <= set(chained["engines"])


def test_tile_and_grid_given(cli_json):
    d = cli_json(*SMALL, "--tile", "64,128,32", "--grid", "2,2,1")
    assert d["tiling"] == {"grid": [2, 2, 1], "tile": [64, 128, 32]} and d["tiling_source"] == "given"
    assert d["pes_used"] == 4 and d["peak_tflops"] == pytest.approx(32)


def test_tile_alone_uses_every_pe_in_a_square_grid(cli_json):
    d = cli_json(*SMALL, "--tile", "64,64,128")
    assert d["tiling"] == {"grid": [2, 4, 1], "tile": [64, 64, 128]} and d["pes_used"] == 8


def test_tile_is_clipped_to_the_block(cli_json):
    d = cli_json(*SMALL, "--tile", "4096,4096,4096")
    assert d["tiling"] == {"grid": [2, 4, 1], "tile": [128, 64, 256]} and "clipped" in d["tiling_source"]


def test_grid_alone_uses_tiles_of_at_most_256(cli_json):
    d = cli_json("bench", "gemm", "--m", "1024", "--n", "100", "--k", "600", "--pes", "0-3", "--grid", "2,1,2")
    assert d["tiling"] == {"grid": [2, 1, 2], "tile": [256, 100, 256]}


def test_square_grid():
    assert _square_grid(8, 256, 256) == (2, 4, 1)
    assert _square_grid(8, 512, 256) == (4, 2, 1)
    assert _square_grid(256, 8192, 8192) == (16, 16, 1)
    assert _square_grid(256, 1, 18944) == (1, 256, 1)
    assert _square_grid(8, 2, 2) is None


def test_flit_exact_close_to_fast(cli_json):
    argv = ("bench", "gemm", "--m", "64", "--n", "64", "--k", "128", "--pes", "0-1")
    fast = cli_json(*argv)
    exact = cli_json(*argv, "--flit-exact")
    assert exact["mode"] == "flit" and exact["events"] > fast["events"]
    assert exact["latency_ns"] == pytest.approx(fast["latency_ns"], rel=0.05)


def test_trace(tmp_path):
    path = tmp_path / "gemm.tsv"
    assert main(["bench", "gemm", "--m", "64", "--n", "64", "--k", "64", "--pes", "0", "--trace", str(path)]) == 0
    text = path.read_text()
    assert text.startswith("#") and "sip0.cube0.pe0.gemm" in text


def test_gemv_on_all_pes(cli_json):
    d = cli_json("bench", "gemm", "--m", "1", "--n", "2048", "--k", "512", "--grid", "1,256,1")
    assert d["pes_used"] == 256 and d["tiling"]["tile"] == [1, 8, 256]
    assert math.isclose(d["peak_tflops"], 2048)


@pytest.mark.parametrize("argv, named", [
    ([*SMALL, "--tile", "0,1,1"], "--tile"),
    ([*SMALL, "--tile", "64,64"], "--tile"),
    ([*SMALL, "--grid", "2,x,1"], "--grid"),
    ([*SMALL, "--grid", "4,4,1"], "--grid"),                       # 16 PEs, --pes has 8
    (["bench", "gemm", "--m", "2", "--n", "2", "--k", "8", "--pes", "0-7", "--tile", "1,1,1"], "--tile"),
    (["bench", "gemm", "--m", "4", "--n", "256", "--k", "64", "--grid", "8,1,1"], "--grid"),
    (["bench", "gemm", "--m", "0", "--n", "256", "--k", "256"], "--m"),
    (["bench", "gemm", "--m", "256", "--n", "-3", "--k", "256"], "--n"),
    (["bench", "gemm", "--m", "256", "--n", "256", "--k", "1.5"], "--k"),
    (["bench", "gemm", "--m", "256", "--n", "256"], "--k"),
    ([*SMALL, "--dtype", "f64"], "--dtype"),
    ([*SMALL, "--check", "--timing-only"], "--check"),
    ([*SMALL[:-1], "0,300"], "PE 300"),
    (["bench", "gemm", "--m", "2048", "--n", "2048", "--k", "2048", "--pes", "0", "--tile", "2048,2048,2048"], "--tile"),
])
def test_errors_exit_2_naming_the_argument(argv, named, cli_error):
    assert named in cli_error(*argv)
