"""Serving capacity of Llama-3-70B plans on maia200_x8 with the Python API (``kbtorch.serve``):
the highest rate of the Azure conversation trace that meets MLPerf's Llama-2-70B server limits
(P99 TTFT 2 s, P99 TPOT 200 ms), per plan, and the plots of ``docs/serving_study.md``.

Plans: one replica tensor parallel over the 8 chips (``tp8``), two replicas of 4 chips behind a
round-robin router (``tp4x2``), those two split prefill/decode (``pd_tp4``). Each search runs
the first ``--requests`` requests of the trace on vLLM's scheduler (budget 2048 tokens a step)
with the step times of ``serve.SimulatedStep``. ``--step-cache`` reads and keeps them in an
SQLite file: the store of ``kbtorch sweep serve_llama70b`` (the same study as a sweep) makes
the searches warm; cold, each plan simulates about 150 shapes (about 15 min on 2 cores).

    python examples/serve_capacity.py --step-cache serve_llama70b.sqlite [--plot-dir DIR] [--json]
"""
from __future__ import annotations

import json
import os
import sys
import time

from tabulate import tabulate

from kbtorch import serve
from kbtorch.cli import ArgumentParser, run_script
from kbtorch.serve.sweep import server
from kbtorch.topology import load_machine

SLOS = {"ttft": "2s", "tpot": "200ms"}
#: name -> (chips per replica, replicas, prefill replicas)
PLANS = {"tp8": (8, 1, 0), "tp4x2": (4, 2, 0), "pd_tp4": (4, 2, 1)}
LABELS = {"tp8": "TP 8", "tp4x2": "2 x TP 4", "pd_tp4": "P/D 2 x TP 4"}


def search(plan: str, requests: int, cache: str | None, machine: str = "maia200_x8"):
    """(the capacity search of ``plan``, its step model)."""
    tp, replicas, prefill = PLANS[plan]
    step, _, serve_at = server(load_machine(machine), cache, "llama3-70b", "azure-conv", requests, tp, replicas,
                               prefill, limits=serve.SchedulerConfig(max_num_batched_tokens=2048), slos=SLOS)
    return serve.find_capacity(serve_at, SLOS, 1.0, 0.05), step


def main(argv=None) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000, help="the first N requests of the trace")
    ap.add_argument("--plans", default=",".join(PLANS), help=f"comma-separated, of {', '.join(PLANS)}")
    ap.add_argument("--step-cache", metavar="SQLITE", help="read and keep simulated step times here")
    ap.add_argument("--plot-dir", metavar="DIR", help="write serve_llama70b_qps.png and a timeline per plan")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    plans = [p.strip() for p in args.plans.split(",") if p.strip()]
    bad = [p for p in plans if p not in PLANS]
    if bad or not plans:
        raise ValueError(f"argument --plans: unknown plan(s) {', '.join(bad) or '(none)'} (known: {', '.join(PLANS)})")
    if args.requests < 1:
        raise ValueError(f"argument --requests: {args.requests} (give at least 1)")
    if args.plot_dir:
        serve.plots.pyplot()        # NOTE: refused before any search when matplotlib is missing
    rows, curves = [], {}
    for plan in plans:
        t0 = time.perf_counter()
        cap, step = search(plan, args.requests, args.step_cache)
        m, chips = (cap.best.metrics if cap.best is not None else {}), step.machine.chips
        rows.append({"plan": plan, "capacity_qps": cap.qps, "per_chip": cap.qps / chips if cap.qps else None,
                     "goodput_per_chip": m["request_goodput"] / chips if m else None,
                     "p99_ttft_ms": m.get("mlperf_p99_ttft_ms"), "p99_tpot_ms": m.get("mlperf_p99_tpot_ms"),
                     "first_failing_qps": cap.failed_qps, "trials": len(cap.trials),
                     "simulated_shapes": step.simulated, "cached_shapes": step.cached,
                     "wall_s": time.perf_counter() - t0})
        curves[LABELS[plan]] = cap.trials
        if args.plot_dir and cap.best is not None:
            os.makedirs(args.plot_dir, exist_ok=True)
            serve.plot_timeline(cap.best, os.path.join(args.plot_dir, f"serve_llama70b_{plan}_timeline.png"))
    if args.plot_dir:
        serve.plot_latency_qps(curves, os.path.join(args.plot_dir, "serve_llama70b_qps.png"), SLOS)
    if args.json:
        print(json.dumps({"plans": rows}))
    else:
        print(tabulate(rows, headers="keys", floatfmt=".4g"))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
