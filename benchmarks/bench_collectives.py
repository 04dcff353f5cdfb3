"""Collectives on AHBM and torus6: bandwidth, startup latency, the coarse mode's error.

All runs are timing-only all-reduces (``kbtorch.ops.collective.collective``), f16:

- **(a) large**: 1 GiB per member over one SIP (128 PEs) and over all 256 PEs, with the
  algorithm ``auto`` picks. Reported: latency, bus bandwidth, % of the bound (the busiest
  resource of the kernel's own traffic, or its startup chain), the bottleneck, events and
  the wall seconds of the whole call. ``--quick``: 64 MiB over one SIP only.
- **(b) small**: 1 KiB per member over a CUBE, a SIP, all 256 PEs and torus6's 48 PEs: every
  algorithm; the best one's latency against its startup bound (alpha_min), and auto's pick.
- **(c) coarse vs fast**: the same all-reduce in both modes (4 MiB per member on a CUBE for
  every algorithm, 768 KiB per member on torus6's six devices, 1 MiB on a SIP, with ring
  and 2d): latency error of coarse against fast and the speed-up in events and wall time.
- **(d) mesh vs torus**: ring and 2d over one SIP, 16 MiB per member, on ``ahbm`` and
  ``ahbm_torus``.

Nothing is asserted: the "targets" block prints PASS/FAIL with the measured figure.

    python benchmarks/bench_collectives.py [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time

from tabulate import tabulate

from kbtorch.ops.collective import ALGOS, collective

TARGET_PCT_BOUND = 90.0
TARGET_STARTUP_X = 1.5
TARGET_WALL_S = 60.0
GiB, MiB, KiB = 2**30, 2**20, 2**10


def run(**kw) -> dict:
    t0 = time.perf_counter()
    r = collective("all_reduce", **kw)
    return dict(r.as_dict(), total_wall_s=time.perf_counter() - t0, startup_ns=r.startup_ps / 1000)


def large(quick: bool) -> list[dict]:
    cases = [("sip", 64 * MiB)] if quick else [("sip", GiB), ("all", GiB)]
    return [dict(run(group=g, nbytes=n), group=g) for g, n in cases]


def small() -> list[dict]:
    """1 KiB on four groups: every algorithm whose alpha-beta estimate is within 3x of the
    best estimate is simulated (the others cannot be the fastest: their command issue alone
    takes longer), then the fastest is set against its own startup bound."""
    out = []
    for topo, group in (("ahbm", "cube"), ("ahbm", "sip"), ("ahbm", "all"), ("torus6", "all")):
        auto = run(group=group, machine=topo, nbytes=KiB)
        best_est = min(auto["candidates_ns"].values())
        rows = [run(group=group, machine=topo, algo=a, nbytes=KiB)
                for a, ns in auto["candidates_ns"].items() if ns <= 3 * best_est]
        best = min(rows, key=lambda r: r["latency_ns"])
        out.append({"topology": topo, "group": group, "best": best["algo"], "latency_ns": best["latency_ns"],
                    "startup_ns": best["startup_ns"], "x_startup": best["latency_ns"] / best["startup_ns"],
                    "auto": auto["algo"], "auto_ns": auto["latency_ns"],
                    "all": {r["algo"]: r["latency_ns"] for r in rows}})
    return out


def coarse_vs_fast() -> list[dict]:
    cases = [("ahbm", "cube", a, 4 * MiB) for a in ALGOS if a != "2d"]
    cases += [("torus6", "0,8,16,24,32,40", a, 768 * KiB) for a in ("ring", "2d")]
    cases += [("ahbm", "sip", a, MiB) for a in ("ring", "2d")]
    out = []
    for topo, group, algo, nbytes in cases:
        f = run(group=group, machine=topo, algo=algo, nbytes=nbytes, mode="fast")
        c = run(group=group, machine=topo, algo=algo, nbytes=nbytes, mode="coarse")
        out.append({"topology": topo, "group": group, "algo": algo, "bytes": nbytes,
                    "fast_ns": f["latency_ns"], "coarse_ns": c["latency_ns"],
                    "error_pct": 100 * (c["latency_ns"] - f["latency_ns"]) / f["latency_ns"],
                    "events_x": f["events"] / c["events"], "wall_x": f["wall_s"] / c["wall_s"]})
    return out


def mesh_vs_torus() -> list[dict]:
    return [dict(run(group="sip", machine=t, algo=a, nbytes=16 * MiB), topology=t)
            for t in ("ahbm", "ahbm_torus") for a in ("ring", "2d")]


def report(res: dict, part: str) -> None:
    """Print one part of the results (as soon as it is measured)."""
    globals()["_report_" + part](res)
    sys.stdout.flush()


def _report_large(res: dict) -> None:
    print("(a) large all-reduce")
    print(tabulate([[r["group"], r["bytes"] // MiB, r["algo"], r["mode"], f"{r['latency_ns'] / 1e3:.1f}",
                     f"{r['busbw_gbps']:.1f}", f"{r['pct_bound']:.1f}", r["bottleneck"], r["events"],
                     f"{r['wall_s']:.1f}", f"{r['total_wall_s']:.1f}"] for r in res["large"]],
                   headers=["group", "MiB", "algo", "mode", "latency us", "busbw GB/s", "% bound", "bottleneck",
                            "events", "sim s", "wall s"]))


def _report_small(res: dict) -> None:
    print("\n(b) 1 KiB all-reduce: best algorithm against its startup bound")
    print(tabulate([[r["topology"], r["group"], r["best"], f"{r['latency_ns']:.0f}", f"{r['startup_ns']:.0f}",
                     f"{r['x_startup']:.2f}", r["auto"], f"{r['auto_ns']:.0f}"] for r in res["small"]],
                   headers=["topology", "group", "best", "latency ns", "startup ns", "x startup", "auto", "auto ns"]))


def _report_coarse(res: dict) -> None:
    print("\n(c) coarse against fast")
    print(tabulate([[r["topology"], r["group"], r["algo"], r["bytes"] // KiB, f"{r['fast_ns']:.0f}",
                     f"{r['coarse_ns']:.0f}", f"{r['error_pct']:+.2f}", f"{r['events_x']:.1f}", f"{r['wall_x']:.1f}"]
                    for r in res["coarse"]],
                   headers=["topology", "group", "algo", "KiB", "fast ns", "coarse ns", "error %", "events x", "wall x"]))


def _report_torus(res: dict) -> None:
    print("\n(d) mesh vs torus, one SIP, 16 MiB")
    print(tabulate([[r["topology"], r["algo"], f"{r['latency_ns'] / 1e3:.1f}", f"{r['busbw_gbps']:.1f}",
                     f"{r['pct_bound']:.1f}"] for r in res["torus"]],
                   headers=["topology", "algo", "latency us", "busbw GB/s", "% bound"]))


def targets(res: dict) -> list[tuple]:
    out = []
    for r in res["large"]:
        out.append((f"{r['bytes'] // MiB} MiB all-reduce over {r['group']}: % of bound", f">= {TARGET_PCT_BOUND}",
                    f"{r['pct_bound']:.1f}", r["pct_bound"] >= TARGET_PCT_BOUND))
        if r["group"] == "all":
            out.append(("1 GiB all-reduce over 256 PEs: wall s", f"< {TARGET_WALL_S}", f"{r['total_wall_s']:.1f}",
                        r["total_wall_s"] < TARGET_WALL_S))
    worst = max(res["small"], key=lambda r: r["x_startup"])
    out.append(("1 KiB all-reduce: best / its startup bound (worst group)", f"<= {TARGET_STARTUP_X}",
                f"{worst['x_startup']:.2f} ({worst['group']})", worst["x_startup"] <= TARGET_STARTUP_X))
    err = max(abs(r["error_pct"]) for r in res["coarse"] if r["algo"] != "direct")
    out.append(("coarse vs fast, largest |error| (ring, bidir, 2d, tree)", "report", f"{err:.2f} %", True))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="64 MiB instead of 1 GiB in part (a)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    res = {"machine": platform.machine(), "python": platform.python_version()}
    for part, fn in (("small", small), ("coarse", coarse_vs_fast), ("torus", mesh_vs_torus),
                     ("large", lambda: large(args.quick))):
        res[part] = fn()
        report(res, part)
    res["targets"] = [dict(zip(("target", "goal", "measured", "pass"), t)) for t in targets(res)]
    print("\ntargets")
    print(tabulate([[t["target"], t["goal"], t["measured"], "PASS" if t["pass"] else "FAIL"] for t in res["targets"]],
                   headers=["target", "goal", "measured", ""]))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
