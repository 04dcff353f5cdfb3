"""``kbtorch bench gemm``: a simulated GEMM with its tiling, analytic estimate, engine use and,
with ``--check``, a comparison against ``torch.matmul``."""
from __future__ import annotations

import argparse
import math
import time

from tabulate import tabulate

from . import limits
from .cli_common import _pes_arg, _positive_int, _triple, _write_trace
from .ops.contract import DTYPES
from .profiler import breakdown_ns, breakdown_table
from .units import fmt_bytes, fmt_ns

#: ``--check`` tolerances (atol, rtol); atol is scaled by sqrt(K).
GEMM_TOLERANCE = {"f16": (1e-2, 1e-2), "bf16": (5e-2, 5e-2), "fp32": (1e-4, 1e-4)}
GEMM_DEFAULT_TILE = 256
GEMM_HELP = """\
Simulate C[M,N] = A[M,K] @ B[K,N] on the PEs of --pes and report latency, TFLOP/s and % of
the peak of the PEs used, the analytic ideal-pipeline estimate (ns, % of peak, bound),
achieved HBM GB/s and % of the used PEs' HBM peak, the tiling, and per-engine utilisation
(busy % = busy time / (latency x number of PEs that used the engine)).

The run is timing-only (no data, no numerics) unless --check is given: then A and B are
random (torch.manual_seed(0), randn in --dtype), C is computed on the same decomposition as
the timing pass and compared with torch.matmul of the same inputs in fp32 (atol x sqrt(K),
rtol: f16 1e-2, bf16 5e-2, fp32 1e-4). --check and --timing-only exclude each other.

Tiling: neither --tile nor --grid picks it automatically (analytic model, near-equal
candidates confirmed by simulation when cheap). --tile alone uses every PE of --pes in the
most square GM x GN grid that fits M and N (the longer side along the larger of M and N),
GK=1. --grid alone uses the tile min(256, block) in each dimension, the block being M/GM,
N/GN and K/GK rounded up. A given tile larger than the block is clipped to it.
"""


def add_parser(bench, parents, family) -> None:
    """Declare ``kbtorch bench gemm``."""
    p = bench.add_parser("gemm", parents=parents, help=family.help,
                         description=GEMM_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", type=_positive_int, required=True, help="rows of A and C")
    p.add_argument("--n", type=_positive_int, required=True, help="columns of B and C")
    p.add_argument("--k", type=_positive_int, required=True, help="columns of A, rows of B")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="f16", help="element type (default f16)")
    p.add_argument("--pes", help="PE list (default: all PEs of the topology)")
    p.add_argument("--tile", type=_triple, metavar="TM,TN,TK", help="macro-tile of each PE")
    p.add_argument("--grid", type=_triple, metavar="GM,GN,GK", help="PE grid (uses the first GM*GN*GK PEs of --pes)")
    p.add_argument("--no-composite", dest="composite", action="store_false",
                   help="issue individual commands chained by semaphores instead of composites")
    numerics = p.add_mutually_exclusive_group()
    numerics.add_argument("--timing-only", action="store_true", help="only the timing pass (the default)")
    numerics.add_argument("--check", action="store_true",
                          help="also compute C from random inputs and compare it with torch.matmul")
    p.add_argument("--flit-exact", action="store_true", help="one event per flit (reference mode)")
    p.set_defaults(func=_cmd_gemm)


def _square_grid(n_pes: int, m: int, n: int) -> tuple[int, int, int] | None:
    """The most square ``gm x gn x 1`` grid of ``n_pes`` PEs with ``gm <= m`` and ``gn <= n``;
    the longer side goes along the larger of M and N (along N on a tie). None if there is none."""
    pairs = [(d, n_pes // d) for d in range(1, n_pes + 1) if n_pes % d == 0]
    pairs = [(gm, gn) for gm, gn in pairs if gm <= m and gn <= n]
    if not pairs:
        return None
    gm, gn = min(pairs, key=lambda g: (abs(math.log(g[0] / g[1])), (g[1] >= g[0]) != (n >= m)))
    return gm, gn, 1


def _gemm_tiling(args, n_pes: int):
    """The tiling the options ask for (None: automatic) and where it came from."""
    if args.tile is None and args.grid is None:
        return None, "auto"
    grid = args.grid
    if grid is None:
        grid = _square_grid(n_pes, args.m, args.n)
        if grid is None:
            raise ValueError(f"argument --tile: no grid of the {n_pes} PEs fits M={args.m} N={args.n}; give --grid")
    elif grid[0] * grid[1] * grid[2] > n_pes:
        raise ValueError(f"argument --grid: {'x'.join(map(str, grid))} needs {grid[0] * grid[1] * grid[2]} PEs "
                         f"but --pes has {n_pes}")
    if grid[0] > args.m or grid[1] > args.n or grid[2] > args.k:
        raise ValueError(f"argument --grid: {'x'.join(map(str, grid))} is larger than the problem "
                         f"M={args.m} N={args.n} K={args.k}")
    block = [-(-size // parts) for size, parts in zip((args.m, args.n, args.k), grid)]
    tile = tuple(min(t, b) for t, b in zip(args.tile or (GEMM_DEFAULT_TILE,) * 3, block))
    source = "given" if args.tile is not None and args.grid is not None else ("given tile" if args.grid is None
                                                                              else "given grid")
    if args.tile is not None and tile != args.tile:
        source += ", clipped to the block"
    from .ops.gemm_plan import GemmTiling

    return GemmTiling(tuple(grid), tuple(tile)), source


def _engine_pes(run, machine) -> dict[str, int]:
    """``{engine role: number of PEs with at least one command on it}`` (the run's programs,
    rebuilt: the run's stats sum the engines over PEs)."""
    from .kernel import build
    from .ops.gemm_kernel import gemm_kernel
    from .ops.gemm_plan import plan

    shards = {s.pe: s for s in plan(run.m, run.n, run.k, run.pes, run.tiling)}
    programs = build(gemm_kernel, run.pes, machine, shards, run.tiling, run.dtype, run.composite, run.out_dtype,
                     name="gemm")
    out: dict[str, int] = {}
    for cmds in programs.values():
        for role in {c.engine for c in cmds}:
            out[role] = out.get(role, 0) + 1
    return out


def _gemm_check(run, a, b) -> dict:
    """Max abs error of C against torch.matmul in fp32, and allclose at the dtype's tolerance."""
    import torch

    ref = a.float() @ b.float()
    got = run.c.float()
    atol, rtol = GEMM_TOLERANCE[run.dtype]
    atol *= math.sqrt(run.k)
    return {"max_abs_err": float((got - ref).abs().max()),
            "allclose": bool(torch.allclose(got, ref, rtol=rtol, atol=atol)), "atol": atol, "rtol": rtol}


def _cmd_gemm(args, machine):
    from .runtime import AllocationError
    from .ops.gemm import gemm

    if args.check:
        # NOTE: --check builds A, B and C on the host: each is bounded before anything is allocated.
        for name, count in (("A", args.m * args.k), ("B", args.k * args.n), ("C", args.m * args.n)):
            limits.check("elements", count, f"--check of M={args.m} N={args.n} K={args.k}: {name}")
    if args.flit_exact:
        limits.check("flits", -(-(args.m * args.k + args.k * args.n) // machine.flit_bytes),
                     f"--flit-exact gemm M={args.m} N={args.n} K={args.k} (one flit at least per {machine.flit_bytes} "
                     f"elements read)")
    pes = _pes_arg(args.pes, len(machine.pes)) if args.pes is not None else list(range(len(machine.pes)))
    tiling, source = _gemm_tiling(args, len(pes))
    mode = "flit" if args.flit_exact else "fast"
    kw = dict(pes=pes, tiling=tiling, composite=args.composite, machine=machine, mode=mode, trace=bool(args.trace))
    t0 = time.perf_counter()
    try:
        if args.check:
            import torch

            torch.manual_seed(0)
            dt = DTYPES[args.dtype].torch
            a, b = torch.randn(args.m, args.k, dtype=dt), torch.randn(args.k, args.n, dtype=dt)
            run = gemm(a, b, **kw)
        else:
            run = gemm(shape=(args.m, args.n, args.k), dtype=args.dtype, **kw)
    except AllocationError as exc:
        if tiling is None:
            raise
        raise ValueError(f"argument {'--tile' if args.tile else '--grid'}: {exc}") from None
    total_wall = time.perf_counter() - t0
    _write_trace(args, run.result)
    result, lat_ps = run.result, run.result.latency_ps
    users = _engine_pes(run, machine)
    engines = {role: {**e, "pes": users.get(role, 0),
                      "busy_pct": 100 * e["busy_ps"] / (lat_ps * users[role]) if users.get(role) and lat_ps else 0.0}
               for role, e in sorted(result.stats["engines"].items())}
    est = run.analytic
    data = {"topology": machine.name, "m": run.m, "n": run.n, "k": run.k, "dtype": run.dtype, "mode": mode,
            "pes": run.pes, "pes_used": len(run.pes), "latency_ns": run.latency_ns, "tflops": run.tflops,
            "peak_tflops": run.peak_tflops, "pct_peak": run.pct_peak, "analytic_ns": est.ns,
            "analytic_pct_peak": run.analytic_pct_peak, "analytic_bound": est.bound,
            "analytic": {"compute_ns": est.compute_ns, "dma_ns": est.dma_ns, "tcm_ns": est.tcm_ns,
                         "overhead_ns": est.overhead_ns},
            "hbm_bytes": run.hbm_bytes, "hbm_gbps": run.hbm_gbps, "hbm_gbps_peak": run.hbm_gbps_peak,
            "pct_hbm": run.pct_hbm, "tiling": {"grid": list(run.tiling.grid), "tile": list(run.tiling.tile)},
            "tiling_source": source, "composite": run.composite, "timing_only": not args.check,
            "engines": engines, "breakdown": breakdown_ns(result), "events": result.events,
            "wall_s": result.wall_s, "total_wall_s": total_wall}
    if args.check:
        data.update(_gemm_check(run, a, b))
    return data, _gemm_text(data, result)


def _gemm_text(d: dict, result) -> str:
    shape = f"{d['m']}x{d['n']}x{d['k']}"
    head = (f"GEMM M x N x K = {shape} {d['dtype']} on {d['pes_used']} PE(s), "
            f"{'composite' if d['composite'] else 'individual commands'} ({d['mode']} mode): "
            f"{fmt_ns(d['latency_ns'])}, {d['tflops']:.2f} TFLOP/s ({d['events']} events in {d['wall_s']:.3f} s)")
    rows = [
        ("latency", fmt_ns(d["latency_ns"])),
        ("throughput", f"{d['tflops']:.3f} TFLOP/s = {d['pct_peak']:.1f}% of {d['peak_tflops']:g} TFLOP/s peak"),
        ("analytic estimate", f"{fmt_ns(d['analytic_ns'])} = {d['analytic_pct_peak']:.1f}% of peak, "
                              f"{d['analytic_bound']}-bound"),
        ("HBM", f"{d['hbm_gbps']:.1f} GB/s = {d['pct_hbm']:.1f}% of {d['hbm_gbps_peak']:g} GB/s peak "
                f"({fmt_bytes(d['hbm_bytes'])})"),
        ("tiling", f"grid {'x'.join(map(str, d['tiling']['grid']))}, tile {'x'.join(map(str, d['tiling']['tile']))} "
                   f"({d['tiling_source']})"),
    ]
    if "allclose" in d:
        rows.append(("check vs torch.matmul", f"max abs err {d['max_abs_err']:.3g}, allclose "
                                              f"{'yes' if d['allclose'] else 'NO'} (atol {d['atol']:.3g}, "
                                              f"rtol {d['rtol']:g})"))
    else:
        rows.append(("numerics", "not run (timing only; --check to compare with torch.matmul)"))
    summary = tabulate(rows, disable_numparse=True)
    engines = tabulate([(role, e["pes"], e["commands"], e["busy_ps"] / 1000, e["busy_pct"])
                        for role, e in d["engines"].items()],
                       headers=("engine", "PEs", "commands", "busy ns (sum)", "busy %"),
                       floatfmt=("", "", "", ".1f", ".1f"))
    if d["composite"]:
        engines += ("\n(a composite occupies the GEMM engine's queue for its whole pipeline; "
                    "its DMA stages are not counted on dma_rd/dma_wr)")
    return "\n\n".join((head, summary, engines, breakdown_table(result, top=8)))
