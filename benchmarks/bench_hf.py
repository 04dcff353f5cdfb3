"""Real torch programs on ahbm: OpInfo coverage, dispatch overhead, Hugging Face generate().

- **(a) OpInfo**: PyTorch's own sample inputs for every op the device claims
  (``tests/test_opinfo.py``): ops claimed, OpInfos run, samples run, samples passed,
  samples refused by name (NotImplementedError), mismatches (must be 0).
- **(b) dispatch overhead** per small op with its kernel cached: wall microseconds of
  ``x + y`` on two 8x8 ahbm tensors, median of repeated runs.
- **(c) Qwen2.5-7B generate()**, full size, timing-only, prompt 128, 8 new tokens
  (``examples/hf_generate.py`` in a fresh process: wall seconds, peak memory
  ``ru_maxrss``), its decode step against ``examples/qwen_layer.py --kv-len 128``'s
  whole-model figure for the same context: the example's default (fused RMSNorm,
  DynamicCache) holds the targets; StaticCache and the eager norms are reported beside
  it. ``--quick`` skips (c) (minutes).

    python benchmarks/bench_hf.py [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import kbtorch  # noqa: E402
from _report import finish, target  # noqa: E402


def opinfo() -> dict:
    import test_opinfo as t
    from torch.utils._pytree import tree_map
    counts = dict(claimed=len(t._claimed()), opinfos=0, samples=0, passed=0, refused=0, mismatches=0)
    with kbtorch.use(str(ROOT / "tests" / "data" / "tiny.toml")):
        for op in t._opinfos():
            if t._id(op) in t.SKIP:
                continue
            counts["opinfos"] += 1
            for dtype in (d for d in t.DTYPES if d in op.supported_dtypes("cpu")):
                for s in itertools.islice(op.sample_inputs("cpu", dtype), t.SAMPLES):
                    try:
                        ref = op(s.input, *s.args, **s.kwargs)
                    except Exception:
                        continue
                    counts["samples"] += 1
                    inp, args, kwargs = tree_map(t._to_ahbm, (s.input, s.args, s.kwargs))
                    if t._aten(op) in t.HOST_ARGS:
                        args, kwargs = s.args, s.kwargs
                    try:
                        t._compare(t._aten(op), op(inp, *args, **kwargs), ref, dtype)
                        counts["passed"] += 1
                    except NotImplementedError:
                        counts["refused"] += 1
                    except AssertionError:
                        counts["mismatches"] += 1
    return counts


def dispatch_us() -> float:
    x, y = torch.randn(8, 8).to("ahbm"), torch.randn(8, 8).to("ahbm")
    x + y                                                       # the kernel, simulated once
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        x + y
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def generate_7b(cache: str, kernels: str) -> dict:
    """``examples/hf_generate.py`` on Qwen2.5-7B in a fresh process: wall, peak RSS, figures."""
    flags = ["--model", "qwen2.5-7b", "--prompt-len", "128", "--new-tokens", "8", "--cache", cache,
             "--kernels", kernels, "--json"]
    cmd = [sys.executable, "-c", f"import resource, sys; sys.path[:0] = ['{ROOT}', '{ROOT / 'examples'}']; import hf_generate; "
           f"hf_generate.main({flags!r}); print('RSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()
    wall = time.perf_counter() - t0
    rec = json.loads(next(line for line in out if line.startswith("{")))
    rss = int(next(line for line in out if line.startswith("RSS")).split()[1]) * 1024
    return dict(cache=cache, kernels=kernels, wall_s=wall, max_rss_bytes=rss, ttft_ns=rec["ttft_ns"],
                tpot_ns=rec["tpot_ns"], decode_step_ns=rec["decode_steps"][0]["ns"])


def layer_token_ns() -> float:
    """``examples/qwen_layer.py --kv-len 128``'s whole-model decode step (ns)."""
    layer = subprocess.run([sys.executable, str(ROOT / "examples" / "qwen_layer.py"), "--kv-len", "128", "--json"],
                           capture_output=True, text=True, check=True).stdout
    return json.loads(layer)["token_ns"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the full-size generate()")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    counts = opinfo()
    print("OpInfo:", counts)
    us = dispatch_us()
    print(f"dispatch overhead per small op (cached kernel): {us:.0f} us")
    targets = [target("OpInfo: zero mismatches",
                      str(counts["mismatches"]),
                      not counts["mismatches"]),
               target("dispatch <= 100 us per small op",
                      f"{us:.0f} us",
                      us <= 100)]
    payload = dict(opinfo=counts, dispatch_us=us)
    if not args.quick:
        # NOTE: the targets are the example's default (fused norms, DynamicCache); the other
        # variants are reported beside it.
        ref = layer_token_ns()
        runs = [generate_7b(c, k) for c, k in (("dynamic", "fused"), ("static", "fused"), ("dynamic", "eager"))]
        for r in runs:
            r["vs_qwen_layer"] = r["decode_step_ns"] / ref
        rows = [(r["cache"], r["kernels"], f"{r['wall_s']:.0f}", f"{r['max_rss_bytes'] / 1e9:.2f}",
                 f"{r['ttft_ns'] / 1e3:.1f}", f"{r['decode_step_ns'] / 1e3:.1f}", f"x{r['vs_qwen_layer']:.3f}")
                for r in runs]
        print(tabulate(rows, headers=("cache", "norms", "wall s", "peak GB", "TTFT us", "decode step us",
                                      f"vs qwen_layer ({ref / 1e3:.1f} us)")))
        g = runs[0]
        ratio = g["vs_qwen_layer"]
        targets += [target("7B generate <= 60 s wall",
                           f"{g['wall_s']:.0f} s",
                           g["wall_s"] <= 60),
                    target("7B generate <= 2 GB peak",
                           f"{g['max_rss_bytes'] / 1e9:.2f} GB",
                           g["max_rss_bytes"] <= 2e9),
                    target("decode step within 10% of qwen_layer",
                           f"x{ratio:.3f}",
                           abs(ratio - 1) <= 0.1)]
        payload["generate_7b"] = dict(qwen_layer_token_ns=ref, runs=runs)
    finish(targets, t0, args.json, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
