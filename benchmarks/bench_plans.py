"""TP 8 vs TP 4 x PP 2 vs EP 8 for Mixtral-8x7B decoding on maia200_x8 (issue 24's plan
comparison): ``kbtorch.models.hf_plans.decode`` for each plan, one decode step after a prefill,
timing only, printed as the table of docs/model.md. The same points as the study
``kbtorch sweep mixtral_plans`` (``kbtorch/studies/mixtral_plans.toml``, stored and resumable).

"TP 8" is the default placement (``place_tp``: column/row-parallel linears over a flat mesh of
all 288 PEs, tensor parallel over the 8 chips), not a 2-D (chips x PEs) mesh plan.

    python benchmarks/bench_plans.py [--batch 8] [--prompt 16] [--plans tp,tp_pp,ep] [--json PATH] [--md PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kbtorch.models.hf_plans import decode  # noqa: E402

PLANS = (("TP over every chip (default placement over all PEs)", "tp"),
         ("TP over a stage's chips x PP 2, 2 micro-batches", "tp_pp"), ("EP over every chip (attention as TP)", "ep"))


def table(rows: list, args) -> str:
    out = [f"{args.model} bf16 on {args.topology}, batch {args.batch}, prompt {args.prompt}, one decode step "
           f"(timing only):", "",
           "| plan | decode step (us) | tokens/s | prefill (us) | % all-to-all | % other collectives | % PP sends |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for label, r in rows:
        out.append(f"| {label} | {r['latency_ns'] / 1e3:.1f} | {r['decode_tokens_per_s']:.0f} | "
                   f"{r['ttft_ns'] / 1e3:.1f} | {r['pct_all_to_all']:.1f} | {r['pct_other_collectives']:.1f} | "
                   f"{r['pct_pp_sends']:.1f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--model", default="mixtral-8x7b")
    ap.add_argument("--topology", default="maia200_x8")
    ap.add_argument("--plans", default=",".join(p for _, p in PLANS), help="which plans (default: all)")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--md", metavar="PATH")
    args = ap.parse_args(argv)
    rows, chosen = [], args.plans.split(",")
    unknown = set(chosen) - {p for _, p in PLANS}
    if unknown:
        ap.error(f"argument --plans: unknown {sorted(unknown)} (known: {', '.join(p for _, p in PLANS)})")
    for label, plan in [(label, plan) for label, plan in PLANS if plan in chosen]:
        t0 = time.perf_counter()
        r = decode(args.topology, plan, args.model, batch=args.batch, prompt=args.prompt)
        r["wall_s"] = time.perf_counter() - t0
        print(f"{label}: {r['latency_ns'] / 1e3:.1f} us a step, {r['wall_s']:.0f} s wall", flush=True)
        rows.append((label, r))
    text = table(rows, args)
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({label: r for label, r in rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
