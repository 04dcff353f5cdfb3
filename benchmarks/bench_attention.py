"""Fused attention on the AHBM topology for Qwen2.5-7B shapes: MAC and HBM efficiency, wall time.

All runs are timing-only (``kbtorch.ops.attention.attention(shape=...)``, no data), bf16,
B=1, Hq=28, Hkv=4, D=128, on all 256 PEs with the automatic tiling:

- **(a) prefill**, causal, S = Lq = Lk in 512, 1024, 2048, 4096: latency, TFLOP/s (useful
  work: 4 D per unmasked score and query head), % of the GEMM (MAC) peak of the PEs used,
  the analytic estimate, events, the simulator's wall seconds and the whole call's.
- **(b) decode**, one query token against a KV cache of Lk = 4096, 16384: latency, HBM
  bytes / latency as % of the aggregate HBM bandwidth of the PEs used, the analytic
  estimate and lower bound, events, wall seconds; and (not with ``--quick``) Lk = 16384
  with ``turns`` (PEs sharing an HBM controller take turns: fewer, longer transfers, so
  fewer events, but a longer drain).

Wall seconds are ``time.perf_counter`` around the ``attention()`` call (tiling choice,
program build, symmetry reduction and simulation), measured once. Nothing is asserted: the
"targets" block prints PASS/FAIL with the measured figure.

    python benchmarks/bench_attention.py [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import sys
import time

from tabulate import tabulate

from kbtorch.ops.attention import attention
from kbtorch.ops.attention_plan import AttentionTiling
from kbtorch.topology import load_machine
from _report import finish

QWEN = dict(b=1, hq=28, hkv=4, d=128)
PREFILL = (512, 1024, 2048, 4096)
DECODE = (4096, 16384)
QUICK_PREFILL = (512, 2048)
QUICK_DECODE = (4096,)
TARGET_MAC_PCT = 60.0
TARGET_HBM_PCT = 70.0
TARGET_PREFILL_WALL_S = 3.0
TARGET_DECODE_WALL_S = 1.0
TURNS = AttentionTiling(br=1, bc=64, chunk=4, tail=16, split=64, turns=True)


def run(machine, lq: int, lk: int, causal: bool, tiling=None) -> dict:
    """One timing-only attention -> its figures (``tiling=None``: automatic)."""
    q = QWEN
    t0 = time.perf_counter()
    r = attention(shape=(q["b"], q["hq"], q["hkv"], lq, lk, q["d"]), is_causal=causal, dtype="bf16", machine=machine,
                  tiling=tiling)
    wall = time.perf_counter() - t0
    return {"kind": r.kind, "lq": lq, "lk": lk, "causal": causal, "auto": tiling is None, "plan": r.plan,
            "pes_used": len(r.pes),
            "latency_ns": r.latency_ns, "flops": r.flops, "tflops": r.tflops, "pct_peak": r.pct_peak,
            "hbm_bytes": r.hbm_bytes, "pct_hbm": r.pct_hbm, "hbm_gbps_peak": r.hbm_gbps_peak,
            "analytic_ns": r.analytic_ns, "bound_ns": r.bound_ns, "events": r.result.events,
            "sim_wall_s": r.result.wall_s, "wall_s": wall}


def table_a(rows) -> str:
    return tabulate([(r["lq"], r["plan"], f"{r['latency_ns'] / 1000:.2f}", f"{r['analytic_ns'] / 1000:.2f}",
                      f"{r['tflops']:.0f}", f"{r['pct_peak']:.1f}", f"{r['pct_hbm']:.1f}", r["events"],
                      f"{r['sim_wall_s']:.2f}", f"{r['wall_s']:.2f}") for r in rows],
                    headers=("S", "plan", "latency us", "analytic us", "TFLOP/s", "MAC % peak", "HBM %", "events",
                             "sim s", "wall s"), disable_numparse=True)


def table_b(rows) -> str:
    return tabulate([(r["lk"], r["plan"], f"{r['latency_ns']:.0f}", f"{r['analytic_ns']:.0f}", f"{r['bound_ns']:.0f}",
                      f"{r['hbm_bytes'] / r['latency_ns']:.0f}", f"{r['hbm_gbps_peak']:.0f}", f"{r['pct_hbm']:.1f}",
                      r["events"], f"{r['sim_wall_s']:.2f}", f"{r['wall_s']:.2f}") for r in rows],
                    headers=("Lk", "plan", "latency ns", "analytic ns", "bound ns", "HBM GB/s", "peak GB/s", "HBM %",
                             "events", "sim s", "wall s"), disable_numparse=True)


def targets(a, b) -> list[dict]:
    out = []
    for r in a:
        if r["lq"] == 4096:
            out.append({"target": f"prefill S=4096 causal: MAC >= {TARGET_MAC_PCT:g}% of the used PEs' peak",
                        "measured": f"{r['pct_peak']:.1f}%", "pass": r["pct_peak"] >= TARGET_MAC_PCT})
        if r["lq"] == 2048:
            out.append({"target": f"prefill S=2048: wall <= {TARGET_PREFILL_WALL_S:g} s",
                        "measured": f"{r['wall_s']:.2f} s ({r['events']} events)",
                        "pass": r["wall_s"] <= TARGET_PREFILL_WALL_S})
    for r in b:
        if r["lk"] == 16384 and r["auto"]:
            out.append({"target": f"decode Lk=16384: HBM >= {TARGET_HBM_PCT:g}% of the used PEs' aggregate",
                        "measured": f"{r['pct_hbm']:.1f}%", "pass": r["pct_hbm"] >= TARGET_HBM_PCT})
            out.append({"target": f"decode Lk=16384: wall <= {TARGET_DECODE_WALL_S:g} s",
                        "measured": f"{r['wall_s']:.2f} s ({r['events']} events)",
                        "pass": r["wall_s"] <= TARGET_DECODE_WALL_S})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="prefill S=512, 2048 and decode Lk=4096 only")
    parser.add_argument("--json", metavar="PATH", help="also write every number as JSON to PATH")
    args = parser.parse_args(argv)
    machine = load_machine("ahbm")
    t0 = time.perf_counter()
    print(f"attention benchmark, Qwen2.5-7B heads (B=1, Hq=28, Hkv=4, D=128), bf16, topology {machine.name} "
          f"({len(machine.pes)} PEs){' --quick' if args.quick else ''}", flush=True)
    a = [run(machine, s, s, True) for s in (QUICK_PREFILL if args.quick else PREFILL)]
    print("\n(a) prefill, causal\n" + table_a(a), flush=True)
    b = [run(machine, 1, lk, False) for lk in (QUICK_DECODE if args.quick else DECODE)]
    b += [] if args.quick else [run(machine, 1, 16384, False, TURNS)]
    print("\n(b) decode, one token against Lk cached keys\n" + table_b(b), flush=True)
    tg = targets(a, b)
    finish(tg, t0, args.json, {"quick": args.quick, "shape": QWEN, "prefill": a, "decode": b})
    return 0


if __name__ == "__main__":
    sys.exit(main())
