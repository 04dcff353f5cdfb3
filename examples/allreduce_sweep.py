"""All-reduce study: every algorithm over payloads from 1 KiB up, on torus6 and AHBM.

For each (topology, group) the script sweeps the per-member payload by powers of four,
simulates every algorithm that applies, and prints a table of latency, bus bandwidth and
percent of the bound, then the break-even payloads between algorithms (where the fastest
one changes). On torus6 it makes the spec's check: the simulated latency follows the
alpha-beta shape, tight at small payloads and within a single-digit factor at the largest.
The last part compares the 2D mesh of AHBM with its torus variant on the same collective.

Payloads are rounded down to a multiple of every algorithm's block count; algorithms whose
alpha-beta estimate is over 3x the best one's are not simulated at that payload. Large groups at
large payloads take minutes each (see benchmarks/README.md): by default the sweep stops at
64 MiB on torus6's 48 PEs, 256 MiB on a CUBE and 1 MiB on a SIP (about half an hour on
2 cores); ``--full`` goes to 1 GiB everywhere (hours).

    python examples/allreduce_sweep.py [--max-bytes 1GiB] [--full] [--json]
"""
from __future__ import annotations

import json
import sys
import time

from tabulate import tabulate

from kbtorch.cli import ArgumentParser, run_script
from kbtorch.ops.collective import ALGOS, Request, collective, estimates
from kbtorch.ops.collective.groups import make_grid, resolve_group
from kbtorch.topology import load_machine
from kbtorch.units import fmt_bytes as _size, parse_bytes

PRUNE = 3.0
#: (topology, group, label, largest payload unless --full)
STUDIES = [
    ("torus6", "0,8,16,24,32,40", "torus6: 6 devices (2x3 torus)", 2**30),
    ("torus6", "all", "torus6: 48 PEs", 2**26),
    ("ahbm", "cube", "AHBM: one CUBE (8 PEs)", 2**28),
    ("ahbm", "sip", "AHBM: one SIP (128 PEs)", 2**20),
]


def sizes(top: int) -> list[int]:
    out, s = [], 1024
    while s <= top:
        out.append(s)
        s *= 4
    return out


def sweep(topology: str, group: str, top: int) -> list[dict]:
    """Every algorithm at every payload (rows of as_dict() plus the nominal size), except
    those whose alpha-beta estimate is over ``PRUNE`` times the best one's: they cannot win
    (their command issue alone takes longer) and large groups make them slow to simulate."""
    machine = load_machine(topology)
    pes = resolve_group(machine, group)
    grid = make_grid(machine, pes)
    n = len(pes)
    rows = []
    for nominal in sizes(top):
        nbytes = max(2 * n * 2, nominal // (4 * n) * 4 * n)
        est = estimates(Request("all_reduce", machine, nbytes=nbytes), grid)
        for algo in ALGOS:
            if algo not in est or est[algo] > PRUNE * min(est.values()):
                continue
            run = collective("all_reduce", group=group, algo=algo, nbytes=nbytes, machine=machine)
            rows.append(dict(run.as_dict(), nominal=nominal))
    return rows


def break_even(rows: list[dict]) -> list[str]:
    """Payloads where the fastest algorithm changes."""
    best, prev, out = None, None, []
    for nominal in sorted({r["nominal"] for r in rows}):
        at = [r for r in rows if r["nominal"] == nominal]
        win = min(at, key=lambda r: r["latency_ns"])["algo"]
        if best is not None and win != best:
            out.append(f"{best} -> {win} between {_size(prev)} and {_size(nominal)}")
        best, prev = win, nominal
    return out


def alpha_beta_check(rows: list[dict]) -> dict:
    """Simulated / alpha-beta ratio at the smallest and largest payload (best algorithm)."""
    def ratio(nominal):
        at = [r for r in rows if r["nominal"] == nominal]
        r = min(at, key=lambda r: r["latency_ns"])
        return r["latency_ns"] / r["analytic_ns"], r["algo"]
    lo, hi = min(r["nominal"] for r in rows), max(r["nominal"] for r in rows)
    (r_lo, a_lo), (r_hi, a_hi) = ratio(lo), ratio(hi)
    ok = 1 / 1.5 <= r_lo <= 1.5 and 1 / 10 < r_hi < 10
    return {"small": {"bytes": lo, "algo": a_lo, "sim_over_analytic": r_lo},
            "large": {"bytes": hi, "algo": a_hi, "sim_over_analytic": r_hi}, "follows_alpha_beta": ok}


def table(rows: list[dict]) -> str:
    body = [[_size(r["nominal"]), r["algo"], f"{r['latency_ns'] / 1000:.2f}", f"{r['busbw_gbps']:.1f}",
             f"{r['pct_bound']:.0f}", f"{r['analytic_ns'] / 1000:.2f}", r["bottleneck"]] for r in rows]
    return tabulate(body, headers=["payload", "algo", "latency us", "busbw GB/s", "% bound", "alpha-beta us",
                                   "bottleneck"])


def mesh_vs_torus(nbytes: int) -> list[dict]:
    out = []
    for topo in ("ahbm", "ahbm_torus"):
        for algo in ("ring", "2d"):
            run = collective("all_reduce", group="sip", algo=algo, nbytes=nbytes, machine=topo)
            out.append({"topology": topo, "algo": algo, "bytes": nbytes, "latency_ns": run.latency_ns,
                        "busbw_gbps": run.busbw_gbps})
    return out


def main(argv=None) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-bytes", type=parse_bytes, default=None, help="largest payload per member (all studies)")
    ap.add_argument("--full", action="store_true", help="go to 1 GiB in every study (slow: tens of minutes)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    report = {"studies": [], "mesh_vs_torus": None}
    for topo, group, label, top in STUDIES:
        limit = 2**30 if args.full else top
        rows = sweep(topo, group, min(limit, args.max_bytes or limit))
        study = {"topology": topo, "group": group, "label": label, "rows": rows, "break_even": break_even(rows)}
        if topo == "torus6":
            study["alpha_beta"] = alpha_beta_check(rows)
        report["studies"].append(study)
        if not args.json:
            print(f"\n== {label} ==\n{table(rows)}\nbreak-even: " + ("; ".join(study["break_even"]) or "none"))
            if "alpha_beta" in study:
                ab = study["alpha_beta"]
                print(f"alpha-beta shape: sim/analytic {ab['small']['sim_over_analytic']:.2f} at "
                      f"{_size(ab['small']['bytes'])}, {ab['large']['sim_over_analytic']:.2f} at "
                      f"{_size(ab['large']['bytes'])} -> {'follows' if ab['follows_alpha_beta'] else 'DOES NOT follow'}")
    mesh_bytes = min(args.max_bytes or 2**22, 2**22)
    report["mesh_vs_torus"] = mesh_vs_torus(mesh_bytes)
    report["wall_s"] = time.perf_counter() - t0
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
    else:
        print(f"\n== AHBM SIP, {_size(mesh_bytes)} per member: 2D mesh vs 2D torus ==")
        print(tabulate([[r["topology"], r["algo"], f"{r['latency_ns'] / 1000:.2f}", f"{r['busbw_gbps']:.1f}"]
                        for r in report["mesh_vs_torus"]], headers=["topology", "algo", "latency us", "busbw GB/s"]))
        print(f"\nwall {report['wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
