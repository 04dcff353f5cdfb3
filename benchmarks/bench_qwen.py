"""Qwen2.5-7B on the "ahbm" device, timing-only: decode efficiency and simulator speed.

- **(a) decode**, batch 1, KV cache L: the whole 28-layer model (``kbtorch.models.qwen2.Model``
  built on the meta device, tensor-parallel over 256 PEs, one ``KVCache`` per layer) runs
  one new token, plus the final norm and the LM head; tokens/s and the fraction of the
  aggregate HBM bandwidth (weights, LM head and KV cache read once per token, over the
  token's simulated time).
- **(b) prefill**, one decoder layer at S = 512 ... 4096 (``examples/qwen_layer.py``, its
  default mapping for prefill: each GEMM on its own 2-D grid of all PEs).

Each point runs in a fresh process (``--point``), so its wall seconds include every kernel
simulated for the first time (nothing cached from another point) and its peak memory
(``ru_maxrss``) is its own. Nothing is asserted: the targets block prints PASS/FAIL.

    python benchmarks/bench_qwen.py [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

DECODE_L = (4096, 16384)
PREFILL_S = (512, 1024, 2048, 4096)
TARGET_L = 16384          # the KV length the HBM target is stated at
TARGETS = {"decode_pct_hbm": 70.0, "prefill_2048_wall_s": 10.0, "decode_wall_s": 20.0, "peak_gb": 2.0}


def decode_point(kv_len: int, graph: bool = False) -> dict:
    """The whole model's decode step at ``kv_len``: eager, or (``graph``) as ONE graph
    (``bench_graph``: a layer's last residual add fuses with the next layer's norm; a
    periodic graph, 3 layers simulated)."""
    from contextlib import nullcontext
    import torch

    import kbtorch
    from kbtorch.models.qwen2 import QWEN2_5_7B as cfg
    from kbtorch.models.qwen2 import KVCache, Model, tensor_parallel
    from kbtorch.models.qwen2_run import lm_head_ns
    t0 = time.perf_counter()
    with kbtorch.timing_only():
        with torch.device("meta"):
            model = Model(cfg).to(torch.bfloat16)
        model.to("ahbm")
        tensor_parallel(model)
    with kbtorch.timing_only(), torch.inference_mode():
        shape = (1, cfg.kv_heads, kv_len + 1, cfg.head_dim)
        caches = [KVCache(torch.empty(shape, dtype=torch.bfloat16, device="ahbm"),
                          torch.empty(shape, dtype=torch.bfloat16, device="ahbm"), kv_len) for _ in range(cfg.layers)]
        token = torch.zeros(1, 1, dtype=torch.long, device="ahbm")
        with kbtorch.profile() as prof, (kbtorch.graph(name="qwen2.5-7b decode") if graph else nullcontext()) as g:
            model(token, torch.tensor([kv_len]), caches)
    head_ns, head_bytes = lm_head_ns(cfg, 1, graph=graph)
    token_ns = prof.total_ns + head_ns
    weights = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("embed")) * 2
    kv_bytes = cfg.layers * 2 * cfg.kv_heads * (kv_len + 1) * cfg.head_dim * 2
    moved = weights + kv_bytes + head_bytes
    machine = kbtorch.current_machine()
    peak = machine.hbm_gbps(range(len(machine.pes)))
    rec = {"kind": "decode", "kv_len": kv_len, "token_us": token_ns / 1000, "tokens_per_s": 1e9 / token_ns,
           "pct_hbm": 100 * moved / token_ns / peak, "ops": len(prof.records), "wall_s": time.perf_counter() - t0}
    if graph:
        rec.update(kind="model", kernels=len(g.plan.kernels), graph_detail=prof.records[0].detail)
    return rec


def prefill_point(seq: int) -> dict:
    import qwen_layer
    t0 = time.perf_counter()
    args = qwen_layer.parse(["--seq", str(seq)])
    prof, _, _ = qwen_layer.run_layer(args)
    attn = [r for r in prof.records if r.name == "aten::scaled_dot_product_attention"]
    return {"kind": "prefill", "seq": seq, "layer_us": prof.total_ns / 1000, "ops": len(prof.records),
            "attention_pct_mac": 100 * attn[0].tflops / 2048 if attn else None, "wall_s": time.perf_counter() - t0}


def run_point(kind: str, size: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--point", kind, str(size)], capture_output=True, text=True,
                         cwd=ROOT)
    if out.returncode:
        raise SystemExit(f"{kind} {size} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="decode L=4096 and prefill S=512 only")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--point", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.point:
        kind, size = args.point[0], int(args.point[1])
        rec = decode_point(size) if kind == "decode" else prefill_point(size)
        rec["peak_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(json.dumps(rec))
        return 0
    from tabulate import tabulate
    points = [("decode", L) for L in (DECODE_L[:1] if args.quick else DECODE_L)]
    points += [("prefill", S) for S in (PREFILL_S[:1] if args.quick else PREFILL_S)]
    recs = [run_point(*p) for p in points]
    print(tabulate([{k: v for k, v in r.items()} for r in recs], headers="keys", floatfmt=".2f"))
    dec = [r for r in recs if r["kind"] == "decode"]
    pre = {r["seq"]: r for r in recs if r["kind"] == "prefill"}
    print("\ntargets")
    for r in dec:
        pct = f"{r['pct_hbm']:.1f}% of HBM"
        if r["kv_len"] == TARGET_L:
            pct += f" (>= {TARGETS['decode_pct_hbm']}%): {'PASS' if r['pct_hbm'] >= TARGETS['decode_pct_hbm'] else 'FAIL'}"
        print(f"  decode L={r['kv_len']}: {pct}; 28-layer step {r['wall_s']:.1f} s wall (<= {TARGETS['decode_wall_s']} s): "
              f"{'PASS' if r['wall_s'] <= TARGETS['decode_wall_s'] else 'FAIL'}")
    if 2048 in pre:
        w = pre[2048]["wall_s"]
        print(f"  prefill S=2048 layer: {w:.1f} s wall (<= {TARGETS['prefill_2048_wall_s']} s): "
              f"{'PASS' if w <= TARGETS['prefill_2048_wall_s'] else 'FAIL'}")
    worst = max(r["peak_gb"] for r in recs)
    print(f"  peak memory {worst:.2f} GB (< {TARGETS['peak_gb']} GB): {'PASS' if worst < TARGETS['peak_gb'] else 'FAIL'}")
    if len(pre) > 1:
        lo, hi = min(pre), max(pre)
        print(f"  prefill wall S={lo} -> {hi}: {pre[lo]['wall_s']:.1f} s -> {pre[hi]['wall_s']:.1f} s "
              f"(x{pre[hi]['wall_s'] / pre[lo]['wall_s']:.1f} for x{hi // lo} tokens)")
    if args.json:
        Path(args.json).write_text(json.dumps({"platform": sys.platform, "points": recs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
