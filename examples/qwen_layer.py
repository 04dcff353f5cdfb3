"""One Qwen2 decoder layer on the "ahbm" device: prefill or decode, profiled op by op.

The layer is ``kbtorch.models.qwen2.DecoderLayer`` in plain torch, moved to ahbm with
``module.to("ahbm")`` and placed by ``--mapping``: ``tp`` (default for decode) is tensor
parallelism over all 256 PEs (``tensor_parallel``: column-parallel q/k/v/gate/up,
row-parallel o/down, the partial sums reduced when the residual add uses them); ``grid``
(default for prefill) replicates the weights, so every GEMM runs on its own automatic 2-D
grid of all PEs with the activation row panels deployed as the GEMM kernel assumes
(uncharged; with ``tp`` a prefill pays 256-PE all-gathers and reduce-scatters instead, and
its thin per-PE GEMM slices re-read the activations). Prefill runs ``--seq S`` tokens
(causal); decode runs one new token against a KV cache of ``--kv-len L`` positions and
reports the tokens/s
of the whole model (``layers`` x this layer + final norm + LM head) and the fraction of
aggregate HBM bandwidth it achieves (weights and KV cache read once per token).

    python examples/qwen_layer.py                        # 7B decode, L = 4096, timing only
    python examples/qwen_layer.py --seq 2048             # 7B prefill (mapping grid)
    python examples/qwen_layer.py --seq 512 --mapping tp            # ... tensor-parallel (minutes)
    python examples/qwen_layer.py --config tiny --seq 9 --check      # numerics vs CPU
    python examples/qwen_layer.py --kv-len 16384 --json --trace out.json
    python examples/qwen_layer.py --hf --config tiny --seq 7 --check  # Hugging Face Qwen2DecoderLayer
    python examples/qwen_layer.py --config tiny --seq 9 --check --topology tests/data/diewide.toml
"""
from __future__ import annotations

import json
import sys
import time
from contextlib import nullcontext

import torch

import kbtorch
from kbtorch.cli import ArgumentParser, run_script
from kbtorch.models.qwen2 import CONFIGS, KVCache, rotary, tensor_parallel
from kbtorch.models.qwen2_run import build_layer, lm_head_ns, replicate, run_hf


def parse(argv):
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="7b")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--seq", type=int, help="prefill S tokens")
    mode.add_argument("--kv-len", type=int, help="decode one token against L cached positions (default 4096)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--mapping", choices=("tp", "grid"),
                    help="tp: tensor-parallel placements (default for decode); grid: replicated weights, every GEMM "
                         "on its own automatic 2-D grid of all PEs, its activation panels deployed as the GEMM "
                         "kernel assumes, uncharged (default for prefill)")
    ap.add_argument("--timing-only", action="store_true", default=None, help="no data (default for 7b)")
    ap.add_argument("--check", action="store_true", help="compare with the same layer on CPU")
    ap.add_argument("--hf", action="store_true", help="run Hugging Face's Qwen2DecoderLayer (needs transformers)")
    ap.add_argument("--trace", metavar="PATH", help="write a Chrome/Perfetto trace")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--mode", choices=("eager", "graph", "both"), default="eager",
                    help="eager: op by op on one stream; graph: the layer captured as one graph (kbtorch.graph: "
                         "overlap, fusion, one launch); both: side by side")
    ap.add_argument("--report", action="store_true", help="graph mode: print the fusion report")
    ap.add_argument("--topology", metavar="NAME|PATH", help="the machine (default: $KBTORCH_TOPOLOGY or ahbm)")
    args = ap.parse_args(argv)
    if args.timing_only is None:
        args.timing_only = args.config == "7b" and not args.check
    if args.check and args.timing_only:
        ap.error("--check needs data: drop --timing-only")
    if args.seq is None and args.kv_len is None:
        args.kv_len = 4096 if args.config == "7b" else 8
    if args.mapping is None:
        args.mapping = "tp" if args.seq is None else "grid"
    for name in ("seq", "kv_len", "batch"):
        value = getattr(args, name)
        if value is not None and value < (1 if name != "kv_len" else 0):
            ap.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    return args


def run_layer(args, graph: bool = False):
    """(profile, output on ahbm, reference on CPU or None); ``graph``: the layer's ops
    captured and timed as one graph (``kbtorch.graph``)."""
    cfg = CONFIGS[args.config]
    dtype = torch.bfloat16 if args.config == "7b" else torch.float16
    decode = args.seq is None
    s = 1 if decode else args.seq
    past = args.kv_len if decode else 0
    torch.manual_seed(0)
    def data():
        return kbtorch.timing_only() if args.timing_only else nullcontext()
    with data():
        layer, ref_layer = build_layer(cfg, dtype, args.timing_only, args.check)
        layer.to("ahbm")
        (tensor_parallel if args.mapping == "tp" else replicate)(layer)
    x = torch.randn(args.batch, s, cfg.hidden, dtype=dtype) if not args.timing_only else None
    kv = (torch.randn(args.batch, cfg.kv_heads, past + s, cfg.head_dim, dtype=dtype) for _ in range(2)) \
        if not args.timing_only else None
    cos, sin = rotary(torch.arange(past, past + s), cfg.head_dim, cfg.rope_theta)
    cos, sin = cos.to(dtype), sin.to(dtype)
    ref = None
    if args.check:
        kv = list(kv)
        with torch.inference_mode():
            ref, _ = ref_layer(x, cos, sin, KVCache(kv[0].clone(), kv[1].clone(), past))
    with data(), torch.inference_mode():
        shape = (args.batch, cfg.kv_heads, past + s, cfg.head_dim)
        if args.timing_only:
            k, v = (torch.empty(shape, dtype=dtype, device="ahbm") for _ in range(2))
            xd = torch.empty(args.batch, s, cfg.hidden, dtype=dtype, device="ahbm")
        else:
            k, v = (t.to("ahbm") for t in kv)
            xd = x.to("ahbm")
        cache = KVCache(k, v, past)
        cd, sd = cos.to("ahbm"), sin.to("ahbm")
        with kbtorch.profile() as prof, kbtorch.graph(name="decoder layer") if graph else nullcontext() as g:
            out, _ = layer(xd, cd, sd, cache)
    prof.graph = g
    return prof, out, ref


def report(args, prof, out, ref, wall: float) -> dict:
    cfg = CONFIGS[args.config]
    rec = {"config": args.config, "mode": "prefill" if args.seq else "decode", "mapping": args.mapping,
           "batch": args.batch,
           "seq": args.seq, "kv_len": args.kv_len, "latency_ns": prof.total_ns,
           "ops": [{"name": r.name, "latency_ns": r.latency_ns, "bottleneck": r.bottleneck} for r in prof.records]}
    if args.seq is None:
        eb = 2
        weights = (cfg.hidden * (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim + cfg.heads * cfg.head_dim * cfg.hidden
                   + 3 * cfg.hidden * cfg.intermediate) * eb
        kv_bytes = 2 * args.batch * cfg.kv_heads * (args.kv_len + 1) * cfg.head_dim * eb
        head_ns, head_bytes = lm_head_ns(cfg, args.batch, graph=getattr(prof, "graph", None) is not None)
        token_ns = cfg.layers * prof.total_ns + head_ns
        moved = cfg.layers * (weights + kv_bytes) + head_bytes
        machine = kbtorch.current_machine()
        peak = machine.hbm_gbps(range(len(machine.pes)))
        rec.update(layers=cfg.layers, lm_head_ns=head_ns, token_ns=token_ns,
                   tokens_per_s=args.batch * 1e9 / token_ns, hbm_bytes_per_token=moved,
                   pct_hbm=100 * moved / token_ns / peak)
    if ref is not None:
        err = (out.cpu().float() - ref.float()).abs().max().item()
        rec.update(max_abs_err=err, allclose=bool(torch.allclose(out.cpu().float(), ref.float(), atol=5e-2, rtol=5e-2)))
    rec["wall_s"] = wall
    return rec


def main(argv=None) -> int:
    args = parse(argv)
    if args.topology:
        kbtorch.use(args.topology)
    if args.mode == "both":
        return both(args)
    t0 = time.perf_counter()
    if args.hf:
        prof, out, ref = run_hf(args)
    else:
        prof, out, ref = run_layer(args, graph=args.mode == "graph")
    rec = report(args, prof, out, ref, time.perf_counter() - t0)
    rec["run_mode"] = args.mode
    if args.report and getattr(prof, "graph", None) is not None:
        print(prof.graph.report())
    if args.trace:
        prof.export_chrome_trace(args.trace)
    if args.json:
        print(json.dumps(rec))
        return 0 if rec.get("allclose", True) else 1
    print(prof.key_averages().table(sort_by="latency_ns", row_limit=25))
    what = f"prefill S={args.seq}" if args.seq else f"decode, KV cache L={args.kv_len}"
    what += f", mapping {args.mapping}"
    print(f"\nQwen2 {args.config} decoder layer, batch {args.batch}, {what}: {prof.total_ns / 1000:.2f} us simulated "
          f"({len(prof.records)} ops, {rec['wall_s']:.1f} s wall)")
    if args.seq is None:
        print(f"{rec['layers']}-layer model + LM head ({rec['lm_head_ns'] / 1000:.2f} us): {rec['token_ns'] / 1000:.1f} us "
              f"a token = {rec['tokens_per_s']:.0f} tokens/s, {rec['pct_hbm']:.1f}% of aggregate HBM bandwidth")
    if ref is not None:
        print(f"max |ahbm - cpu| = {rec['max_abs_err']:.4f}, matches: {rec['allclose']}")
    return 0 if rec.get("allclose", True) else 1


def both(args) -> int:
    """Eager and graph mode side by side (``--mode both``)."""
    if args.hf:
        raise SystemExit("--mode both runs the kbtorch layer (drop --hf)")
    recs = {}
    for mode in ("eager", "graph"):
        t0 = time.perf_counter()
        prof, out, ref = run_layer(args, graph=mode == "graph")
        recs[mode] = report(args, prof, out, ref, time.perf_counter() - t0)
        if mode == "graph" and args.report:
            print(prof.graph.report())
    if args.json:
        print(json.dumps(recs))
    else:
        keys = [k for k in ("latency_ns", "token_ns", "tokens_per_s", "pct_hbm", "max_abs_err", "wall_s")
                if k in recs["eager"]]
        print(f"{'':16}{'eager':>14}{'graph':>14}")
        for k in keys:
            print(f"{k:16}{recs['eager'][k]:14.2f}{recs['graph'][k]:14.2f}")
    return 0 if all(r.get("allclose", True) for r in recs.values()) else 1


if __name__ == "__main__":
    sys.exit(run_script(main))
