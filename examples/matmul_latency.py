"""A torch script that reports latency: matrix products on the "ahbm" device.

Moves two matrices to ahbm, multiplies them with ``@`` (dispatched to the GEMM tile kernel:
a timing pass on the simulator, a numeric pass with torch), checks the product against
torch on CPU and prints each op's simulated latency and throughput.

    python examples/matmul_latency.py [--m 1024 --n 1024 --k 1024] [--dtype f16] [--json]
    python examples/matmul_latency.py --timing-only --m 8192 --n 8192 --k 8192
"""
from __future__ import annotations

import json
import sys

import torch

import kbtorch
from kbtorch import limits
from kbtorch.cli import ArgumentParser, run_script

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def main(argv=None) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=1024)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f16")
    ap.add_argument("--timing-only", action="store_true", help="no data (any size fits), no check")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    for name in ("m", "n", "k"):
        if getattr(args, name) < 1:
            ap.error(f"argument --{name}: must be positive, got {getattr(args, name)}")
    if not args.timing_only:
        for name, count in (("A", args.m * args.k), ("B", args.k * args.n), ("C", args.m * args.n)):
            limits.check("elements", count, f"{name} of {args.m}x{args.k} @ {args.k}x{args.n} with data "
                                            f"(--timing-only runs any size)")
    if args.timing_only:
        with kbtorch.timing_only(), kbtorch.profile() as prof:
            a = torch.empty(args.m, args.k, dtype=DTYPES[args.dtype], device="ahbm")
            a @ torch.empty(args.k, args.n, dtype=DTYPES[args.dtype], device="ahbm")
        mm = prof.records[0]
        out = {"latency_ns": mm.latency_ns, "mm_tflops": mm.tflops, "tiling": mm.detail}
        print(json.dumps(out) if args.json else f"{args.m}x{args.k} @ {args.k}x{args.n} {args.dtype}: "
              f"{mm.latency_ns / 1000:.2f} us, {mm.tflops:.1f} TFLOP/s ({mm.detail}), timing only")
        return 0
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(args.m, args.k, generator=gen).to(DTYPES[args.dtype])
    b = torch.randn(args.k, args.n, generator=gen).to(DTYPES[args.dtype])

    with kbtorch.profile() as prof:
        c = a.to("ahbm") @ b.to("ahbm")
        d = c * 0.5 + c

    ref = (a.float() @ b.float()).to(a.dtype)
    err = (c.cpu().float() - ref.float()).abs().max().item()
    ok = torch.allclose(d.cpu().float(), (ref * 0.5 + ref).float(), atol=0.1, rtol=2e-2)
    mm = prof.records[0]
    out = {"latency_ns": prof.total_ns, "mm_latency_ns": mm.latency_ns, "mm_tflops": mm.tflops,
           "tiling": mm.detail, "max_abs_err": err, "allclose": ok,
           "ops": [{"name": r.name, "latency_ns": r.latency_ns, "bottleneck": r.bottleneck} for r in prof.records]}
    if args.json:
        print(json.dumps(out))
    else:
        print(prof.key_averages().table(sort_by="latency_ns"))
        print(f"\nC = A @ B, {args.m}x{args.k} @ {args.k}x{args.n} {args.dtype}: {mm.latency_ns / 1000:.2f} us, "
              f"{mm.tflops:.1f} TFLOP/s ({mm.detail}); whole script {prof.total_ns / 1000:.2f} us simulated")
        print(f"max |C - torch| = {err:.4f}; result matches CPU: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run_script(main))
