"""Large and MoE models on one machine: HbmFull before any work, tiny MoE numerics, full-size
timing-only decode (issue 24's single-machine rows; the multi-chip rows come with meshes
over systems).

- **(a) HbmFull**: DeepSeek-V3 and Mixtral-8x22B (bf16, meta) moved to one maia200 are
  refused before any tensor moves (seconds to refuse); Llama-3-70B's bytes against the chip.
- **(b) tiny MoE**: ``examples/hf_generate.py --check`` on tiny Qwen3-MoE, OLMoE and
  DeepSeek-V3: greedy tokens equal CPU.
- **(c) full-size decode**, timing-only, batch 1, prompt 4, 2 new tokens
  (``examples/hf_generate.py`` in a fresh process): Qwen3-30B-A3B on maia200 (61 GB),
  DeepSeek-V3 on ahbm (1342 GB of 1649 GB): time per token, % of the HBM roofline, wall.
- **(d) Mixtral-8x7B on maia200_x8 with EP 8**, timing-only, batch 1, prompt 4, one decode
  step (``kbtorch.models.hf_plans.decode``, plan ``ep``): decode tokens/s, the share of the
  step's op time in the all-to-alls, the experts routed per layer (top-2 of 8 for one token)
  and the share of all experts' weight bytes the step's expert GEMMs read (2 of 8: ~25%).
  ``--quick`` skips (c) and (d) (minutes each).

    python benchmarks/bench_models.py [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

import kbtorch  # noqa: E402
from _report import finish  # noqa: E402

REFUSED = (("deepseek-v3", "maia200"), ("mixtral-8x22b", "maia200"), ("llama3-70b", "maia200"))
TINY = ("tiny-qwen3-moe", "tiny-olmoe", "tiny-deepseek-v3")
FULL = (("qwen3-30b-a3b", "maia200"), ("deepseek-v3", "ahbm"))


def hbm_check(name: str, topology: str) -> dict:
    from kbtorch.models.hf import build
    from kbtorch.tensor.memory import HbmFull
    model, _ = build(name, torch.bfloat16, timing_only=True)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    t0 = time.perf_counter()
    with kbtorch.use(topology), kbtorch.timing_only():
        try:
            model.to("ahbm")
            error = None
        except HbmFull as exc:
            error = str(exc)
    return dict(model=name, topology=topology, gb=nbytes / 1e9, refused=error, seconds=time.perf_counter() - t0)


def generate(name: str, *flags: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "hf_generate.py"), "--model", name, "--json", *flags],
                         capture_output=True, text=True, env=env)
    if out.returncode not in (0, 1):
        raise RuntimeError(f"{name}: {out.stderr[-2000:]}")
    rec = json.loads(out.stdout)
    rec["wall_s"] = time.perf_counter() - t0
    return rec


def ep_row() -> dict:
    """Row (d): Mixtral-8x7B decoding on maia200_x8 under expert parallelism over its 8 chips."""
    from kbtorch.models.hf_plans import decode
    t0 = time.perf_counter()
    row = decode("maia200_x8", "ep", "mixtral-8x7b", batch=1, prompt=4)
    return dict(row, wall_s=time.perf_counter() - t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the full-size decode runs")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    checks = [hbm_check(m, t) for m, t in REFUSED]
    targets = []
    for c in checks:
        print(f"{c['model']} ({c['gb']:.1f} GB bf16) on {c['topology']}: "
              f"{'HbmFull in %.2f s: %s' % (c['seconds'], c['refused']) if c['refused'] else 'fits'}")
        targets.append(dict(target=f"{c['model']} on one {c['topology']}: HbmFull before any work",
                            measured=f"HbmFull in {c['seconds']:.2f} s" if c["refused"] else f"fits ({c['gb']:.1f} GB)",
                            **{"pass": bool(c["refused"]) and c["seconds"] < 5}))
    tiny = [generate(name, "--check", "--prompt-len", "8", "--new-tokens", "2", "--batch", "2") for name in TINY]
    for r in tiny:
        targets.append(dict(target=f"{r['model']}: greedy tokens equal CPU", measured=str(r["tokens_match_cpu"]),
                            **{"pass": r["tokens_match_cpu"]}))
    payload = dict(hbm=checks, tiny=tiny)
    if not args.quick:
        full = [generate(name, "--topology", topo, "--prompt-len", "4", "--new-tokens", "2") for name, topo in FULL]
        for (name, topo), r in zip(FULL, full):
            step = r["decode_steps"][0]
            print(f"{name} on {topo}: {r['tpot_ns'] / 1e3:.1f} us a token, {step['pct_hbm_roofline']:.1f}% of the HBM "
                  f"roofline, {r['wall_s']:.0f} s wall")
            targets.append(dict(target=f"{name} full-size decode runs on {topo}",
                                measured=f"{r['tpot_ns'] / 1e3:.0f} us/token, {step['pct_hbm_roofline']:.1f}% HBM",
                                **{"pass": r["tpot_ns"] > 0}))
        payload["full"] = full
        payload["ep"] = ep = ep_row()
        print(f"mixtral-8x7b on maia200_x8, EP 8: {ep['decode_tokens_per_s']:.0f} tokens/s, {ep['pct_all_to_all']:.1f}% "
              f"in all-to-all, {ep['experts_routed_per_layer']} experts routed a layer, "
              f"{ep['pct_expert_bytes_read']:.1f}% of expert weight bytes read, {ep['wall_s']:.0f} s wall")
        targets.append(dict(target="Mixtral-8x7B on maia200_x8 with EP 8: runs; all-to-all visible; only routed "
                                   "experts read",
                            measured=f"{ep['decode_tokens_per_s']:.0f} tokens/s, {ep['pct_all_to_all']:.1f}% all-to-all, "
                                     f"{ep['experts_routed_per_layer']}/8 experts, {ep['pct_expert_bytes_read']:.1f}% "
                                     f"of expert bytes",
                            **{"pass": ep["pct_all_to_all"] > 0 and ep["experts_routed_per_layer"] == 2
                               and 20 < ep["pct_expert_bytes_read"] < 30}))
    finish(targets, t0, args.json, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
