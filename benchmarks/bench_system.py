"""Systems of chips (issue 23): maia200_x8, maia200_x64 and maia200_pod from system files.

All collectives are timing-only, bf16, with the chips as members (group ``across:chip:4``:
four tiles of each chip drive its ports, see kbtorch/ops/collective/units.py); sizes "per
chip" are each chip's own block (the paper's Fig. 8 axis), ``nbytes`` the gathered output.

- **topo**: ``maia200_x8``'s PEs and bf16 peak (target: 288 PEs, 8 x 1180 TFLOP/s).
- **all-gather**: direct, ring and bidir-ring from 1 KiB to 500 MiB per chip (``--quick``: up
  to 64 MiB), % of the paper's bound max(4 us, 7 x per chip / 1.4 TiB/s); the best at 500
  MiB, the smallest size where ring (the paper's one-directional ring, the target) and
  bidir-ring (reported beside it) beat direct, the 1 KiB latency.
- **all-reduce 1 GiB** on maia200_x8 (algorithm auto): % of the kernel's bound, wall.
- **all-to-all 64 MiB** per chip on maia200_x8: % of its bound.
- **64 chips**: a 1 GiB all-reduce across 64 chips, load included, wall: on 64 coarse chips
  (``maia200_pod`` at 16 trays, one PE per chip: "use coarse mode where needed"; about
  130 s, 7.2 M events), and beside it on maia200_x64's full chips at 16 MiB (about 50 s,
  1.28 M events: there, 1 GiB is about 82 M events, hours and more than 17 GB, so it is
  not run). ``--quick``: both at 16 MiB.
- **pod**: maia200_pod (6144 coarse chips) loaded, and one all-reduce across all chips (64 KiB per chip, recursive doubling).

Nothing is asserted: the targets block prints PASS/FAIL with the measured figure.
maia200_x8 declares packet spraying (``[routing] policy = "port-spray"``, adaptive: a
message between chips over their tray link and the switched network; maia200_x64 stays
single-path, see its file); the
all-gather rows also run ``hier`` (direct along the tray, then across trays forwarded inside
the tray), the algorithm the automatic choice takes on the sprayed machine for large sizes.

    python benchmarks/bench_system.py [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import resource
import sys
import time

from tabulate import tabulate

from _report import finish
from kbtorch.ops.collective import collective
from kbtorch.topology import load_machine

KiB, MiB, GiB = 2**10, 2**20, 2**30
GROUP = "across:chip:4"
PAPER_LAT_NS, PAPER_BW = 4000.0, 1.4 * 2**40 / 1e9      # the paper's Fig. 8 bounds (bytes/ns)


def timed(kind: str, machine, nbytes: int, algo: str = "auto", group: str = GROUP) -> dict:
    """One collective; wall and CPU seconds of the whole call (the 2-core machine is shared:
    CPU seconds are what it costs when it has a core to itself)."""
    t0, c0 = time.perf_counter(), time.process_time()
    r = collective(kind, group=group, algo=algo, machine=machine, nbytes=nbytes, dtype="bf16")
    return dict(r.as_dict(), total_wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0)


def topo() -> dict:
    m = load_machine("maia200_x8")
    return {"pes": len(m.pes), "chips": m.chips, "bf16_tflops": m.peak_tflops("bf16")}


def allgather(quick: bool) -> list[dict]:
    m = load_machine("maia200_x8")
    sizes = [1 * KiB, 256 * KiB, 4 * MiB, 16 * MiB, 64 * MiB] if quick else \
        [1 * KiB, 64 * KiB, 1 * MiB, 2 * MiB, 3 * MiB, 4 * MiB, 9 * MiB, 16 * MiB, 64 * MiB, 500 * MiB]
    out = []
    for per in sizes:
        for algo in ("direct", "ring", "bidir-ring", "hier"):
            r = timed("all_gather", m, per * m.chips, algo)
            sol = max(PAPER_LAT_NS, (m.chips - 1) * per / PAPER_BW)
            out.append(dict(r, per_chip=per, pct_paper=100 * sol / r["latency_ns"]))
            print(f"  all-gather {per // KiB:>7} KiB per chip {algo:6s} {r['latency_ns'] / 1e3:10.1f} us "
                  f"{out[-1]['pct_paper']:5.1f}% of the paper's bound ({r['total_wall_s']:.0f} s)", flush=True)
    return out


def summary(points: list) -> dict:
    by = {(p["algo"], p["per_chip"]): p for p in points}
    sizes = sorted({p["per_chip"] for p in points})
    wins = {a: [s for s in sizes if by[(a, s)]["latency_ns"] < by[("direct", s)]["latency_ns"]]
            for a in ("ring", "bidir-ring")}
    top = sizes[-1]
    algos = sorted({p["algo"] for p in points})
    best = max(algos, key=lambda a: by[(a, top)]["pct_paper"])
    return {"largest_per_chip": top, "best_pct_largest": by[(best, top)]["pct_paper"], "best_algo_largest": best,
            "break_even_per_chip": wins["ring"][0] if wins["ring"] else None,
            "break_even_bidir_per_chip": wins["bidir-ring"][0] if wins["bidir-ring"] else None,
            "lat_1kib_ns": min(by[(a, KiB)]["latency_ns"] for a in algos)}


def sixty_four(nbytes: int, coarse: bool = False) -> dict:
    """Load 64 chips (maia200_x64, or maia200_pod at 16 trays: coarse chips) and all-reduce
    ``nbytes`` across them (full chips: ``GROUP``; coarse: each chip's one PE)."""
    t0, c0 = time.perf_counter(), time.process_time()
    m = load_machine("maia200_pod", overrides={"system.trays": 16}) if coarse else load_machine("maia200_x64")
    load_s = time.perf_counter() - t0
    r = timed("all_reduce", m, nbytes, group="across:chip" if coarse else GROUP)
    return dict(r, load_s=load_s, total_s=time.perf_counter() - t0, total_cpu_s=time.process_time() - c0,
                machine=m.name, chips=m.chips)


def pod() -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    m = load_machine("maia200_pod")
    load_s, load_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    r = timed("all_reduce", m, 64 * KiB, algo="tree", group="across:chip")
    return dict(r, load_s=load_s, load_cpu_s=load_cpu_s, chips=m.chips, total_s=time.perf_counter() - t0,
                max_rss_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="all-gather up to 64 MiB per chip; the 64 coarse chips' all-reduce of 16 MiB, not 1 GiB; no pod")
    ap.add_argument("--json", help="write every number to this file")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    res = {"topo": topo()}
    print(f"topo maia200_x8: {res['topo']['pes']} PEs, {res['topo']['chips']} chips, "
          f"{res['topo']['bf16_tflops']:.0f} bf16 TFLOP/s")
    res["allgather"] = allgather(args.quick)
    ag = res["allgather_summary"] = summary(res["allgather"])
    x8 = load_machine("maia200_x8")
    for key, run in (("allreduce", lambda: timed("all_reduce", x8, GiB)),
                     ("alltoall", lambda: timed("all_to_all", x8, 64 * MiB * x8.chips)),
                     ("x64", lambda: sixty_four(16 * MiB)),
                     ("x64_coarse", lambda: sixty_four(16 * MiB if args.quick else GiB, coarse=True)),
                     ("pod", None if args.quick else pod)):
        res[key] = run() if run else None
        if res[key]:
            r = res[key]
            print(f"  {key}: {r['algo']} {r['latency_ns'] / 1e3:.1f} us, {r['pct_bound']:.1f}% of bound, "
                  f"{r['total_wall_s']:.0f} s wall, {r['cpu_s']:.0f} s CPU", flush=True)
    rows = [(k, res[k]["algo"], res[k]["mode"], f"{res[k]['latency_ns'] / 1e3:.1f}", f"{res[k]['busbw_gbps']:.0f}",
             f"{res[k]['pct_bound']:.1f}", res[k]["bottleneck"], f"{res[k]['total_wall_s']:.0f}")
            for k in ("allreduce", "alltoall", "x64", "x64_coarse", "pod") if res[k]]
    print(tabulate(rows, headers=("run", "algo", "mode", "latency us", "busbw GB/s", "% bound", "bottleneck", "wall s")))
    be, bidir = ag["break_even_per_chip"], ag["break_even_bidir_per_chip"]
    c, x = res["x64_coarse"], res["x64"]
    targets = [
        {"target": "topo maia200_x8: 288 PEs, 8 x 1180 bf16 TFLOP/s",
         "measured": f"{res['topo']['pes']} PEs, {res['topo']['bf16_tflops']:.0f} TFLOP/s",
         "pass": res["topo"]["pes"] == 288 and abs(res["topo"]["bf16_tflops"] - 8 * 1179.648) < 1},
        {"target": f"all-gather {ag['largest_per_chip'] // MiB} MiB per chip >= 85% of the paper's bound (best)",
         "measured": f"{ag['best_pct_largest']:.1f}% ({ag['best_algo_largest']})", "pass": ag["best_pct_largest"] >= 85},
        {"target": "direct/ring break-even within 3-27 MiB per chip",
         "measured": ("none" if be is None else f"{be / MiB:.2f} MiB") + " (bidir-ring: "
                     + ("none" if bidir is None else f"first wins at {bidir / MiB:.2f} MiB") + ")",
         "pass": be is not None and 3 * MiB <= be <= 27 * MiB},
        {"target": "1 KiB per chip all-gather within 2.5-10 us", "measured": f"{ag['lat_1kib_ns'] / 1e3:.2f} us",
         "pass": 2500 <= ag["lat_1kib_ns"] <= 10000},
        {"target": "all-reduce 1 GiB >= 85% of bound, wall <= 120 s",
         "measured": f"{res['allreduce']['pct_bound']:.1f}%, {res['allreduce']['total_wall_s']:.0f} s "
                     f"({res['allreduce']['cpu_s']:.0f} s CPU)",
         "pass": res["allreduce"]["pct_bound"] >= 85 and res["allreduce"]["total_wall_s"] <= 120},
        {"target": "all-to-all 64 MiB per chip runs, % of bound reported",
         "measured": f"{res['alltoall']['pct_bound']:.1f}%", "pass": True},
        {"target": "64 chips: load + 1 GiB all-reduce <= 120 s", "measured": f"{c['total_s']:.0f} s on 64 coarse "
         f"chips, {c['bytes'] // MiB} MiB (load {c['load_s']:.0f} s; {c['total_cpu_s']:.0f} s CPU; {c['events'] / 1e6:.1f} M "
         f"events); full chips (maia200_x64) 16 MiB: {x['total_s']:.0f} s, {x['events'] / 1e6:.2f} M events",
         "pass": c["bytes"] == GiB and c["total_s"] <= 120},
    ]
    if res["pod"]:
        p = res["pod"]
        targets.append({"target": "pod: 6144 chips load + one collective", "measured": f"{p['chips']} chips, load "
                        f"{p['load_s']:.0f} s ({p['load_cpu_s']:.0f} s CPU), all-reduce {p['total_wall_s']:.0f} s, {p['max_rss_gb']:.1f} GB",
                        "pass": p["chips"] == 6144})
    finish(targets, t0, args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
