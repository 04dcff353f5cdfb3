"""GEMM tiling study: the Qwen2.5-7B projections on all 256 PEs of AHBM.

Qwen2.5-7B has hidden size 3584, intermediate size 18944 and GQA with 4 KV heads of 128
(K and V projections of 512 columns each). For S tokens the projections are:

- ``qkv``      (S, 3584) x (3584, 3584 + 2*512)   fused Q, K, V
- ``o``        (S, 3584) x (3584, 3584)
- ``gate+up``  (S, 3584) x (3584, 2*18944)        fused gate and up
- ``down``     (S, 18944) x (18944, 3584)

For each shape the table shows the automatic tiling (``*``; the analytic model ranks the
tilings that fit the TCM, near-equal ones are confirmed by simulation when that is cheap)
and the best other analytic candidate: its PE grid and macro-tile, its analytic rank, the
simulated and the analytic latency, the MAC efficiency (% of the f16 peak of the PEs used)
both ways, their gap, the % of the used PEs' HBM bandwidth achieved, and the latency without
composite commands (individual commands chained by semaphores) with the composite's gain.
All runs are timing-only (``gemm(shape=...)``, no data).

    python examples/gemm_tiling.py                 # S = 1 and 128, about 3.5 minutes
    python examples/gemm_tiling.py --quick         # S = 1 and 128, automatic tiling only, about 2.5 minutes
    python examples/gemm_tiling.py --seq 1,128,2048  # the full study, about 10 minutes

(S = 2048 is not in the default run only because each of its simulations takes 10-30 s.)
The automatic choice simulates its best candidates; those runs are reused for the table
(``kbtorch.ops.gemm``'s ``candidates`` and ``simulate`` are memoized while the study runs),
so every configuration is ranked and simulated once.
"""
from __future__ import annotations

import contextlib
import inspect
import sys
import time

from tabulate import tabulate

import kbtorch.ops.gemm as gemm_mod
from kbtorch.cli import ArgumentParser, run_script
from kbtorch.ops.gemm import gemm
from kbtorch.topology import load_machine

HIDDEN, INTERMEDIATE, KV = 3584, 18944, 512
#: name -> (N, K) of ``(S, K) x (K, N)``
PROJECTIONS = {
    "qkv": (HIDDEN + 2 * KV, HIDDEN),
    "o": (HIDDEN, HIDDEN),
    "gate+up": (2 * INTERMEDIATE, HIDDEN),
    "down": (HIDDEN, INTERMEDIATE),
}
DEFAULT_SEQ = (1, 128)
FULL_SEQ = (1, 128, 2048)


class _Memo:
    """A memoizing stand-in for a function of ``kbtorch.ops.gemm``, keyed on its arguments
    (the machine by identity, lists as tuples)."""

    def __init__(self, fn):
        self.fn, self.sig, self.cache = fn, inspect.signature(fn), {}

    def __call__(self, *args, **kwargs):
        bound = self.sig.bind(*args, **kwargs)
        bound.apply_defaults()
        key = tuple((name, id(v) if name == "machine" else tuple(v) if isinstance(v, list) else v)
                    for name, v in bound.arguments.items())
        if key not in self.cache:
            self.cache[key] = self.fn(*args, **kwargs)
        return self.cache[key]


@contextlib.contextmanager
def shared_work():
    """Memoize ``candidates`` and ``simulate`` in ``kbtorch.ops.gemm`` (what ``auto_tiling``
    and ``gemm`` call) for the duration of the study; restored afterwards."""
    saved = {name: getattr(gemm_mod, name) for name in ("candidates", "simulate") if hasattr(gemm_mod, name)}
    try:
        for name, fn in saved.items():
            setattr(gemm_mod, name, _Memo(fn))
        yield
    finally:
        for name, fn in saved.items():
            setattr(gemm_mod, name, fn)


def study(machine, seq: list[int], tilings: int, dtype: str = "f16") -> list[dict]:
    """One row per (S, projection, tiling): the automatic tiling and up to ``tilings - 1``
    other analytic candidates, each with and without composite commands."""
    pes = list(range(len(machine.pes)))
    rows = []
    with shared_work():
        for s in seq:
            for name, (n, k) in PROJECTIONS.items():
                ranked = gemm_mod.candidates(machine, s, n, k, dtype, pes)
                auto = gemm(shape=(s, n, k), dtype=dtype, pes=pes, machine=machine)
                order = [t for _, t in ranked]
                chosen = [auto.tiling] + [t for t in order if t != auto.tiling][: tilings - 1]
                for tiling in chosen:
                    t0 = time.perf_counter()
                    run = auto if tiling == auto.tiling else gemm(shape=(s, n, k), dtype=dtype, pes=pes,
                                                                  tiling=tiling, machine=machine)
                    off = gemm(shape=(s, n, k), dtype=dtype, pes=pes, tiling=tiling, composite=False, machine=machine)
                    rows.append({
                        "S": s, "proj": name, "shape": f"{s}x{n}x{k}", "tiling": tiling.describe(),
                        "auto": tiling == auto.tiling,
                        "rank": order.index(tiling) + 1 if tiling in order else None,
                        "sim_us": run.latency_ns / 1000, "analytic_us": run.analytic.ns / 1000,
                        "eff_sim": run.pct_peak, "eff_analytic": run.analytic_pct_peak,
                        "pct_hbm": run.pct_hbm, "bound": run.analytic.bound, "off_us": off.latency_ns / 1000,
                        "wall_s": time.perf_counter() - t0,
                    })
                    print(f"  S={s} {name}: {tiling.describe()} done", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    out = []
    for r in rows:
        gap = 100 * (r["sim_us"] - r["analytic_us"]) / r["analytic_us"]
        gain = 100 * (r["off_us"] - r["sim_us"]) / r["off_us"]
        out.append((r["S"], r["proj"], r["shape"], r["tiling"], "*" if r["auto"] else "", r["rank"] or "-",
                    f"{r['sim_us']:.2f}", f"{r['analytic_us']:.2f}", f"{r['eff_sim']:.1f}", f"{r['eff_analytic']:.1f}",
                    f"{gap:+.1f}", f"{r['pct_hbm']:.1f}", r["bound"], f"{r['off_us']:.2f}", f"{gain:+.1f}"))
    return tabulate(out, headers=("S", "proj", "MxNxK", "tiling", "auto", "rank", "sim us", "analytic us",
                                  "MAC % sim", "MAC % analytic", "gap %", "HBM %", "bound", "no-composite us",
                                  "composite gain %"), disable_numparse=True)


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", help=f"comma-separated S values (default {','.join(map(str, DEFAULT_SEQ))}; "
                                      f"the full study: {','.join(map(str, FULL_SEQ))})")
    parser.add_argument("--quick", action="store_true", help="S = 1 and 128, the automatic tiling only")
    parser.add_argument("--tilings", type=int, help="tilings per shape: the automatic one and the best other "
                                                    "analytic candidates (default 2, --quick 1)")
    args = parser.parse_args(argv)
    try:
        seq = [int(x) for x in args.seq.split(",")] if args.seq else list(DEFAULT_SEQ)
    except ValueError:
        parser.error(f"argument --seq: invalid S list '{args.seq}' (expected e.g. 1,128,2048)")
    if not seq or min(seq) < 1:
        parser.error("argument --seq: S values must be positive")
    tilings = args.tilings if args.tilings is not None else (1 if args.quick else 2)
    if tilings < 1:
        parser.error("argument --tilings: must be at least 1")
    machine = load_machine("ahbm")
    t0 = time.perf_counter()
    print(f"Qwen2.5-7B projections, f16, {len(machine.pes)} PEs, S = {', '.join(map(str, seq))}", flush=True)
    rows = study(machine, seq, tilings)
    print()
    print(table(rows))
    print(f"\n* = automatic tiling; rank = its place in the analytic ranking; gap = simulated vs analytic latency; "
          f"HBM % of the used PEs' peak; composite gain = latency saved vs individual commands. "
          f"{time.perf_counter() - t0:.0f} s.")


if __name__ == "__main__":
    sys.exit(run_script(main))
