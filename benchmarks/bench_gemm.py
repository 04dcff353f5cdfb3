"""GEMM on the AHBM topology: MAC efficiency, HBM efficiency and the analytic model's accuracy.

All runs are timing-only (``kbtorch.ops.gemm.gemm(shape=(M, N, K))``, no data), f16:

- **(a) large GEMM**: 8192 x 8192 x 8192 on 256 PEs, with the automatic tiling and with grid
  16x16x1, tile 512x512x1024. Reported: latency, % of the MAC peak of the PEs used, the
  analytic estimate, events, and the wall seconds of the whole ``gemm()`` call (the
  automatic tiling's choice included; measured once, not repeated).
- **(b) GEMV**: M=1, K=3584, N=18944 (``shape=(1, 18944, 3584)``) on 256 PEs, with the
  automatic tiling and with grid 1x256x1, tile 1x74x512. Reported: achieved HBM GB/s (HBM
  bursts x 256 B / latency) and its % of the aggregate HBM bandwidth of the PEs used.
- **(c) model accuracy**: 4096 x 4096 x 4096 on 64 PEs (grid 8x8x1, blocks 512x512x4096)
  over macro-tiles ``tm = tn`` in 128..512 and ``tk`` in 256..2048, i.e. 2 to 256 tiles per
  PE: simulated vs analytic MAC efficiency and their gap ``(analytic - simulated) /
  analytic``. The spec reports the simulator tracking the ideal-pipeline model within
  roughly 10-20 %; gaps over 20 % are flagged.

Nothing is asserted: the "targets" block prints PASS/FAIL with the measured figure.

    python benchmarks/bench_gemm.py [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import sys
import time

from tabulate import tabulate

from kbtorch.ops.gemm import gemm
from kbtorch.ops.gemm_plan import GemmTiling
from kbtorch.topology import load_machine
from _report import finish

TARGET_MAC_PCT = 95.0
TARGET_WALL_S = 30.0
TARGET_HBM_PCT = 80.0
GAP_FLAG_PCT = 20.0

LARGE = (8192, 8192, 8192)
LARGE_TILING = GemmTiling((16, 16, 1), (512, 512, 1024))
GEMV = (1, 18944, 3584)
GEMV_TILING = GemmTiling((1, 256, 1), (1, 74, 512))
SWEEP = (4096, 4096, 4096)
SWEEP_PES = 64
SWEEP_GRID = (8, 8, 1)
SWEEP_MN = (128, 256, 512)
SWEEP_K = (256, 512, 1024, 2048)
QUICK_MN = (256, 512)
QUICK_K = (512, 2048)


def run(machine, shape, tiling, pes) -> dict:
    """One timing-only GEMM -> its figures (``tiling=None``: automatic)."""
    t0 = time.perf_counter()
    r = gemm(shape=shape, dtype="f16", pes=pes, tiling=tiling, machine=machine)
    wall = time.perf_counter() - t0
    tiles = 1
    for size, parts, t in zip(shape, r.tiling.grid, r.tiling.tile):
        tiles *= _ceil(_ceil(size, parts), t)                   # of the largest block
    return {"shape": list(shape), "tiling": {"grid": list(r.tiling.grid), "tile": list(r.tiling.tile)},
            "tiling_text": r.tiling.describe() + ("" if tiling is not None else " (auto)"), "auto": tiling is None,
            "pes_used": len(r.pes), "tiles_per_pe": tiles, "latency_ns": r.latency_ns, "tflops": r.tflops,
            "pct_peak": r.pct_peak, "analytic_ns": r.analytic.ns, "analytic_pct_peak": r.analytic_pct_peak,
            "analytic_bound": r.analytic.bound, "hbm_gbps": r.hbm_gbps, "hbm_gbps_peak": r.hbm_gbps_peak,
            "pct_hbm": r.pct_hbm, "events": r.result.events, "sim_wall_s": r.result.wall_s, "wall_s": wall}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def part_a(machine, quick: bool) -> list[dict]:
    pes = list(range(len(machine.pes)))
    tilings = [LARGE_TILING] if quick else [None, LARGE_TILING]
    return [run(machine, LARGE, t, pes) for t in tilings]


def part_b(machine) -> list[dict]:
    pes = list(range(len(machine.pes)))
    return [run(machine, GEMV, t, pes) for t in (None, GEMV_TILING)]


def part_c(machine, quick: bool) -> list[dict]:
    pes = list(range(SWEEP_PES))
    out = []
    for t in (QUICK_MN if quick else SWEEP_MN):
        for tk in (QUICK_K if quick else SWEEP_K):
            r = run(machine, SWEEP, GemmTiling(SWEEP_GRID, (t, t, tk)), pes)
            r["gap_pct"] = 100 * (r["analytic_pct_peak"] - r["pct_peak"]) / r["analytic_pct_peak"]
            r["flag"] = abs(r["gap_pct"]) > GAP_FLAG_PCT
            out.append(r)
    return out


def _shape(s) -> str:
    return "x".join(map(str, s))


def table_a(rows) -> str:
    return tabulate([(_shape(r["shape"]), r["tiling_text"], r["pes_used"], f"{r['latency_ns'] / 1000:.1f}",
                      f"{r['tflops']:.1f}", f"{r['pct_peak']:.2f}", f"{r['analytic_pct_peak']:.2f}", r["analytic_bound"],
                      r["events"], f"{r['wall_s']:.1f}") for r in rows],
                    headers=("MxNxK", "tiling", "PEs", "latency us", "TFLOP/s", "MAC % peak", "analytic %",
                             "bound", "events", "wall s"), disable_numparse=True)


def table_b(rows) -> str:
    return tabulate([(_shape(r["shape"]), r["tiling_text"], r["pes_used"], f"{r['latency_ns']:.0f}",
                      f"{r['hbm_gbps']:.0f}", f"{r['hbm_gbps_peak']:.0f}", f"{r['pct_hbm']:.1f}",
                      f"{r['analytic_ns']:.0f}", r["events"], f"{r['wall_s']:.1f}") for r in rows],
                    headers=("MxNxK", "tiling", "PEs", "latency ns", "HBM GB/s", "peak GB/s", "HBM %",
                             "analytic ns", "events", "wall s"), disable_numparse=True)


def table_c(rows) -> str:
    return tabulate([(r["tiling_text"], r["tiles_per_pe"], f"{r['latency_ns'] / 1000:.1f}", f"{r['analytic_ns'] / 1000:.1f}",
                      f"{r['pct_peak']:.1f}", f"{r['analytic_pct_peak']:.1f}", f"{r['gap_pct']:+.1f}",
                      "> 20%" if r["flag"] else "", r["analytic_bound"], f"{r['pct_hbm']:.1f}", f"{r['wall_s']:.1f}")
                     for r in rows],
                    headers=("tiling", "tiles/PE", "sim us", "analytic us", "MAC % sim", "MAC % analytic", "gap %",
                             "flag", "bound", "HBM %", "wall s"), disable_numparse=True)


def targets(a, b, c) -> list[dict]:
    out = []
    for r in a:
        out.append({"target": f"8192^3 {r['tiling_text']}: MAC >= {TARGET_MAC_PCT:g}% of peak",
                    "measured": f"{r['pct_peak']:.2f}%", "pass": r["pct_peak"] >= TARGET_MAC_PCT})
        out.append({"target": f"8192^3 {r['tiling_text']}: wall < {TARGET_WALL_S:g} s",
                    "measured": f"{r['wall_s']:.1f} s ({r['events']} events)", "pass": r["wall_s"] < TARGET_WALL_S})
    for r in b:
        out.append({"target": f"GEMV 1x3584x18944 {r['tiling_text']}: HBM >= {TARGET_HBM_PCT:g}% of the used PEs' peak",
                    "measured": f"{r['pct_hbm']:.1f}% ({r['hbm_gbps']:.0f} GB/s)", "pass": r["pct_hbm"] >= TARGET_HBM_PCT})
    worst = max(c, key=lambda r: abs(r["gap_pct"]))
    out.append({"target": f"sweep: |sim vs analytic MAC efficiency gap| <= {GAP_FLAG_PCT:g}% at every point",
                "measured": f"largest {worst['gap_pct']:+.1f}% ({worst['tiling_text']}); "
                            f"{sum(r['flag'] for r in c)} of {len(c)} flagged",
                "pass": not any(r["flag"] for r in c)})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="(a) given tiling only, (b) both, (c) 4 points instead of 12")
    parser.add_argument("--json", metavar="PATH", help="also write every number as JSON to PATH")
    args = parser.parse_args(argv)
    machine = load_machine("ahbm")
    t0 = time.perf_counter()
    print(f"GEMM benchmark, f16, topology {machine.name} ({len(machine.pes)} PEs){' --quick' if args.quick else ''}",
          flush=True)
    a = part_a(machine, args.quick)
    print("\n(a) 8192 x 8192 x 8192 on 256 PEs: MAC efficiency and wall time\n" + table_a(a), flush=True)
    b = part_b(machine)
    print("\n(b) GEMV M=1, K=3584, N=18944 on 256 PEs: HBM efficiency\n" + table_b(b), flush=True)
    c = part_c(machine, args.quick)
    print(f"\n(c) 4096^3 on {SWEEP_PES} PEs, grid {'x'.join(map(str, SWEEP_GRID))}: simulated vs analytic MAC "
          f"efficiency (gap = (analytic - sim) / analytic)\n" + table_c(c), flush=True)
    tg = targets(a, b, c)
    finish(tg, t0, args.json, {"quick": args.quick, "large": a, "gemv": b, "sweep": c})
    return 0


if __name__ == "__main__":
    sys.exit(main())
