"""HBM streaming bandwidth on the AHBM topology.

Each participating PE's DMA read engine streams ``--bytes`` (default 1 MiB) from its own HBM
slice into its own TCM, all PEs starting at t=0:

- configurations: 1, 2 and 8 PEs of CUBE 0, and 8 PEs x 4 CUBEs (PEs 0-31);
- address patterns: ``uniform`` (contiguous: bursts interleave over all pseudo-channels of
  the slice) and ``hot-channel`` (source stride = channels * burst_bytes, so every burst
  maps to the same pseudo-channel).

Reported: aggregate GB/s (total bytes / run latency), per-PE GB/s (bytes / that PE's
completion time; min, mean, max), fast vs flit-exact latency (the 1-PE runs always; every
configuration unless ``--quick``), events and wall seconds (``time.perf_counter`` around
``Simulator(...).run``; short runs repeated, best kept). Nothing is asserted: the "targets"
block prints PASS/FAIL with the measured figure.

    python benchmarks/bench_hbm.py [--quick] [--json PATH] [--bytes N]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time

from tabulate import tabulate

from kbtorch.sim.commands import Dma, Loc, Signal
from kbtorch.sim.simulator import Simulator
from kbtorch.topology import load_machine
from kbtorch.units import parse_bytes

PATTERNS = ("uniform", "hot-channel")
MODES = ("fast", "flit")
TARGET_CUBE_GBPS = 1024.0
TARGET_HOT_GBPS = 32.0
TOLERANCE = 0.05


def configs(machine) -> list[tuple[str, list[int]]]:
    """(name, PE ids): 1, 2, 8 PEs of CUBE 0 and 8 PEs of each of the first 4 CUBEs."""
    per_cube: dict = {}
    for pe in machine.pes:
        cube = tuple(sorted((k, v) for k, v in pe.coords.items() if k != "pe"))  # the PE's CUBE
        per_cube.setdefault(cube, []).append(pe.id)
    cubes = [sorted(v) for _, v in sorted(per_cube.items(), key=lambda kv: min(kv[1]))]
    cube0 = cubes[0]
    return [("1 PE, CUBE 0", cube0[:1]), ("2 PEs, CUBE 0", cube0[:2]), ("8 PEs, CUBE 0", cube0[:8]),
            ("8 PEs x 4 CUBEs", [p for c in cubes[:4] for p in c[:8]])]


def program(machine, pe_id: int, nbytes: int, pattern: str) -> Dma:
    pe = machine.pes[pe_id]
    p = machine.graph.nodes[pe.hbm]["params"]
    stride = p["channels"] * p["burst_bytes"] if pattern == "hot-channel" else 0
    return Dma(src=Loc(pe.hbm), dst=Loc(pe.node("tcm")), nbytes=nbytes, engine="dma_rd", src_stride=stride,
               signals=(Signal("done"),), label=f"hbm {pattern} PE {pe_id}")


def timed(make_run, min_s: float, max_reps: int = 50):
    """Repeat ``make_run()`` until ``min_s`` seconds are spent -> (last value, best wall s, reps)."""
    walls = []
    while True:
        t0 = time.perf_counter()
        value = make_run()
        walls.append(time.perf_counter() - t0)
        if sum(walls) >= min_s or len(walls) >= max_reps:
            return value, min(walls), len(walls)


def run_once(machine, pes: list[int], nbytes: int, pattern: str, mode: str):
    sim = Simulator(machine, mode=mode)
    result = sim.run({pe: [program(machine, pe, nbytes, pattern)] for pe in pes})
    finish = {pe: sim.pe(pe).sem_chain["done"][0] for pe in pes}
    return result, finish


def measure(machine, name: str, pes: list[int], nbytes: int, pattern: str, with_flit: bool, min_s: float) -> dict:
    out = {"config": name, "pattern": pattern, "pes": pes, "bytes": nbytes}
    for mode in MODES if with_flit else ("fast",):
        (result, finish), wall, reps = timed(lambda: run_once(machine, pes, nbytes, pattern, mode), min_s)
        out[mode] = {"latency_ps": result.latency_ps, "events": result.events, "wall_s": wall, "reps": reps,
                     "events_per_s": result.events / wall if wall > 0 else float("inf"),
                     "gbps": len(pes) * nbytes / result.latency_ns,
                     "per_pe_gbps": {str(pe): nbytes * 1000 / t for pe, t in finish.items()}}
    fa = out["fast"]
    per = list(fa["per_pe_gbps"].values())
    out.update(gbps=fa["gbps"], per_pe_min=min(per), per_pe_mean=sum(per) / len(per), per_pe_max=max(per))
    if with_flit:
        fl = out["flit"]
        out["latency_equal"] = fa["latency_ps"] == fl["latency_ps"]
        out["latency_rel_diff"] = abs(fa["latency_ps"] - fl["latency_ps"]) / fl["latency_ps"]
        diffs = [abs(fa["per_pe_gbps"][k] - fl["per_pe_gbps"][k]) / fl["per_pe_gbps"][k] for k in fa["per_pe_gbps"]]
        out["per_pe_max_rel_diff"] = max(diffs)
    print(f"  {name:16s} {pattern:11s}: {out['gbps']:8.1f} GB/s, fast {fa['wall_s']:.3f} s"
          + (f", flit {out['flit']['wall_s']:.3f} s" if with_flit else ""), file=sys.stderr, flush=True)
    return out


def within(x: float, want: float) -> bool:
    return abs(x - want) <= TOLERANCE * want


def targets(rows: list[dict]) -> list[dict]:
    cube = next(r for r in rows if r["config"] == "8 PEs, CUBE 0" and r["pattern"] == "uniform")
    hot = [r for r in rows if r["pattern"] == "hot-channel"]
    lo, hi = min(r["per_pe_min"] for r in hot), max(r["per_pe_max"] for r in hot)
    one = [r for r in rows if len(r["pes"]) == 1 and "flit" in r]
    agree = all(r["latency_equal"] for r in one)
    worst = max(r["latency_rel_diff"] for r in one)
    return [
        {"target": "8 PEs of one CUBE, uniform, aggregate", "want": f"{TARGET_CUBE_GBPS:.0f} GB/s +-{TOLERANCE:.0%}",
         "measured": f"{cube['gbps']:.1f} GB/s", "value": cube["gbps"], "pass": within(cube["gbps"], TARGET_CUBE_GBPS)},
        {"target": "hot-channel, per PE (all configurations)", "want": f"{TARGET_HOT_GBPS:.0f} GB/s +-{TOLERANCE:.0%}",
         "measured": f"{lo:.2f} .. {hi:.2f} GB/s", "value": [lo, hi],
         "pass": within(lo, TARGET_HOT_GBPS) and within(hi, TARGET_HOT_GBPS)},
        {"target": "1 PE: fast latency == flit-exact latency", "want": "equal",
         "measured": "equal" if agree else f"differ by {worst:.4%}", "value": worst, "pass": agree},
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="flit-exact reference only for the 1-PE runs")
    ap.add_argument("--json", metavar="PATH", help="also write the numbers as JSON to PATH")
    ap.add_argument("--bytes", default="1MiB", help="bytes streamed per PE (default 1MiB)")
    args = ap.parse_args(argv)
    nbytes = parse_bytes(args.bytes, minimum=1)

    t_start = time.perf_counter()
    machine = load_machine("ahbm")
    min_s = 0.1 if args.quick else 0.3
    print(f"bench_hbm: topology {machine.name}, {nbytes} bytes per PE, HBM slice -> own TCM on dma_rd, "
          f"{'quick' if args.quick else 'full'} run, python {platform.python_version()}", flush=True)
    rows = []
    for name, pes in configs(machine):
        for pattern in PATTERNS:
            rows.append(measure(machine, name, pes, nbytes, pattern, not args.quick or len(pes) == 1, min_s))

    def flit(r, key, scale=1):
        return r["flit"][key] / scale if "flit" in r else None

    print("\nHBM -> TCM streaming (GB/s from the fast mode; flit-exact columns where run)")
    print(tabulate(
        [(r["config"], r["pattern"], r["gbps"], r["per_pe_min"], r["per_pe_mean"], r["per_pe_max"],
          r["fast"]["latency_ps"] / 1000, flit(r, "latency_ps", 1000),
          ("yes" if r["latency_equal"] else f"NO ({r['latency_rel_diff']:.4%})") if "flit" in r else None,
          r["fast"]["events"], flit(r, "events"), r["fast"]["wall_s"], flit(r, "wall_s"))
         for r in rows], missingval="-",
        headers=("configuration", "pattern", "aggregate GB/s", "per PE min", "per PE mean", "per PE max",
                 "lat ns fast", "lat ns flit", "equal", "ev fast", "ev flit", "wall s fast", "wall s flit"),
        floatfmt=("", "", ".1f", ".2f", ".2f", ".2f", ".3f", ".3f", "", ".0f", ".0f", ".4f", ".3f")), flush=True)

    tg = targets(rows)
    print("\ntargets")
    print(tabulate([(t["target"], t["want"], t["measured"], "PASS" if t["pass"] else "FAIL") for t in tg],
                   headers=("target", "want", "measured", "result")))
    total = time.perf_counter() - t_start
    print(f"\nwall time of this script: {total:.1f} s")

    if args.json:
        data = {"benchmark": "bench_hbm", "topology": machine.name, "quick": args.quick, "bytes_per_pe": nbytes,
                "python": platform.python_version(), "machine": platform.machine(),
                "runs": rows, "targets": tg, "script_wall_s": total}
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
