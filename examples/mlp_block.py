"""An ``nn.Module`` on the "ahbm" device: a SwiGLU MLP block, profiled and checked against CPU.

The block (Qwen-style: ``down(silu(gate(x)) * up(x))`` plus a residual) is built in plain
torch, moved to ahbm with ``module.to("ahbm")`` (parameters keep their identity), run under
``kbtorch.profile()``, and its output compared with the same module on CPU.

    python examples/mlp_block.py [--tokens 16] [--hidden 512] [--intermediate 1536] [--json]
    python examples/mlp_block.py --timing-only --hidden 3584 --intermediate 18944   # Qwen2.5-7B sizes
"""
from __future__ import annotations

import json
import sys

import torch
from torch import nn

import kbtorch
from kbtorch import limits
from kbtorch.cli import ArgumentParser, run_script


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return x + self.down(nn.functional.silu(self.gate(x)) * self.up(x))


def main(argv=None) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--trace", metavar="PATH", help="write a Chrome/Perfetto trace")
    ap.add_argument("--timing-only", action="store_true", help="no data: full sizes in bounded memory, no check")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    for name in ("tokens", "hidden", "intermediate"):
        if getattr(args, name) < 1:
            ap.error(f"argument --{name}: must be positive, got {getattr(args, name)}")
    if not args.timing_only:
        limits.check("elements", max(args.tokens, args.hidden) * args.intermediate,
                     f"arguments --tokens {args.tokens} --hidden {args.hidden} --intermediate {args.intermediate} "
                     f"with data (--timing-only runs any size)")
    torch.manual_seed(0)
    if args.timing_only:
        with kbtorch.timing_only(), torch.no_grad():
            block = SwiGLU(args.hidden, args.intermediate).to(device="meta", dtype=torch.float16).to("ahbm")
            with kbtorch.profile() as prof:
                block(torch.empty(args.tokens, args.hidden, dtype=torch.float16, device="ahbm"))
        err, ok = None, True
    else:
        prof, err, ok = _run_and_check(args)
    if args.trace:
        prof.export_chrome_trace(args.trace)
    out = {"latency_ns": prof.total_ns, "max_abs_err": err, "allclose": ok if err is not None else None,
           "ops": [{"name": r.name, "latency_ns": r.latency_ns, "bottleneck": r.bottleneck} for r in prof.records]}
    if args.json:
        print(json.dumps(out))
    else:
        print(prof.key_averages().table(sort_by="latency_ns"))
        check = "timing only, no numerics" if err is None else f"max |ahbm - cpu| = {err:.4f}, matches: {ok}"
        print(f"\nSwiGLU block, {args.tokens} tokens, hidden {args.hidden}, intermediate {args.intermediate}: "
              f"{prof.total_ns / 1000:.2f} us simulated; {check}")
    return 0 if ok else 1


def _run_and_check(args):
    """The block on CPU, then on ahbm under the profiler: (profile, max abs error, allclose)."""
    block = SwiGLU(args.hidden, args.intermediate).half()
    x = torch.randn(args.tokens, args.hidden, dtype=torch.float16)
    with torch.no_grad():
        ref = block(x)
        block.to("ahbm")
        with kbtorch.profile() as prof:
            y = block(x.to("ahbm"))
    err = (y.cpu().float() - ref.float()).abs().max().item()
    return prof, err, torch.allclose(y.cpu().float(), ref.float(), atol=5e-2, rtol=2e-2)


if __name__ == "__main__":
    sys.exit(run_script(main))
