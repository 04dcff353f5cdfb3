"""Large and MoE models on one machine: HbmFull before any work, tiny MoE numerics, full-size
timing-only decode (issue 24's single-machine rows; the multi-chip rows come with meshes
over systems).

- **(a) HbmFull**: DeepSeek-V3 and Mixtral-8x22B (bf16, meta) moved to one maia200 are
  refused before any tensor moves (seconds to refuse); Llama-3-70B's weights (141 GB) fit
  the chip's 216 GB, and the KV cache of a serving batch (32 rows at its 8192-position
  context, 86 GB) is refused before any work (``kbtorch.models.hf.check_cache_fits``, as
  ``hf_generate`` checks every run's cache).
- **(b) tiny MoE**: ``examples/hf_generate.py --check`` on tiny Qwen3-MoE, OLMoE and
  DeepSeek-V3: greedy tokens equal CPU.
- **(c) full-size decode**, timing-only, batch 1, prompt 4, 2 new tokens
  (``examples/hf_generate.py`` in a fresh process): Qwen3-30B-A3B on maia200 (61 GB),
  DeepSeek-V3 on ahbm (1342 GB of 1649 GB): time per token, % of the HBM roofline, wall.
- **(d) Mixtral-8x7B on maia200_x8 with EP 8**, timing-only, batch 1, prompt 4, one decode
  step (``kbtorch.models.hf_plans.decode``, plan ``ep``): decode tokens/s, the share of the
  step's op time in the all-to-alls, the experts routed per layer (top-2 of 8 for one token)
  and the share of all experts' weight bytes the step's expert GEMMs read (2 of 8: ~25%).
- **(e) tensor parallel across chips**: Llama-3-70B on maia200_x8, TP 8 (mesh chips x PEs,
  ``kbtorch.tp_plan``), batch 16: prompt 128 + 8 tokens (wall, tokens/s, share of the time
  in collectives), and one decode step at L = 4096 over a KV cache made on the device (no
  prefill simulated), eager and captured as one graph: tokens/s, % of the HBM roofline,
  share in collectives.
  ``--quick`` skips (c), (d) and (e) (minutes each).

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
sys.path.insert(0, str(ROOT / "examples"))

import torch  # noqa: E402

import kbtorch  # noqa: E402
from _report import finish, target  # noqa: E402

#: (model, machine, KV cache (batch, positions) or None). NOTE: Llama-3-70B's bf16 weights
#: (141 GB) fit one maia200 (216 GB): it is refused with the cache of a serving batch (32 rows
#: at its 8192-position context: 86 GB more).
REFUSED = (("deepseek-v3", "maia200", None), ("mixtral-8x22b", "maia200", None), ("llama3-70b", "maia200", (32, 8192)))
TINY = ("tiny-qwen3-moe", "tiny-olmoe", "tiny-deepseek-v3")
FULL = (("qwen3-30b-a3b", "maia200"), ("deepseek-v3", "ahbm"))


def hbm_check(name: str, topology: str, cache: tuple | None) -> dict:
    """``name`` (bf16, meta) moved to one ``topology``, then (``cache``) the KV cache of
    (batch, positions) checked against what its weights leave (``check_cache_fits``): refused?"""
    from kbtorch.models.hf import build, check_cache_fits, kv_cache
    model, _ = build(name, torch.bfloat16, timing_only=True)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = sum(b for _, _, b in kv_cache(model.config, *cache, 2)) if cache else 0
    t0 = time.perf_counter()
    with kbtorch.use(topology) as machine, kbtorch.timing_only():
        try:
            model.to("ahbm")
            if cache:
                check_cache_fits(model, *cache)
            error = None
        except kbtorch.HbmFull as exc:
            error = str(exc)
        hbm = machine.capacity("hbm", 0)
    return dict(model=name, topology=topology, gb=nbytes / 1e9, cache=cache, cache_gb=kv / 1e9, hbm_gb=hbm / 1e9,
                refused=error, seconds=time.perf_counter() - t0)


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
#: Llama-3-70B tensor parallel over maia200_x8 (8 chips x 36 PEs, mesh (chip, pe)), batch 16.
TP_RUN = ("llama3-70b", "--topology", "maia200_x8", "--tp", "8", "--batch", "16")


def decode_point(name: str = "llama3-70b", topology: str = "maia200_x8", tp: int = 8, batch: int = 16,
                 context: int = 4096, static: bool = False, graph: bool = False) -> dict:
    """One decode step of ``name`` (timing-only, fused norms, the plan of ``hf.place_plan``)
    at ``context`` positions: a KV cache of ``context - 1`` positions made on ahbm (no
    prefill simulated; ``static``: a ``StaticCache`` written in place, else the
    ``DynamicCache`` that concatenates), then one token per row, eager or (``graph``) captured
    as ONE graph. -> latency, tokens/s, % of the HBM roofline (``hf_generate.step_bytes``),
    share of the time in collectives (of a graph: of its kernels' summed spans), wall."""
    from contextlib import nullcontext

    import transformers
    from hf_generate import step_bytes
    from kbtorch.models.hf import build, fuse_norms, place_plan
    t0 = time.perf_counter()
    model, _ = build(name, torch.bfloat16, timing_only=True)
    fuse_norms(model)
    cfg = model.config
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    with kbtorch.use(topology) as machine, kbtorch.timing_only(), torch.no_grad():
        plan, _ = place_plan(model, tp)
        # NOTE: placed as the k/v projections leave them (column-parallel: sharded on the heads
        # along both mesh dimensions), as a prefill would have written the cache.
        mesh = kbtorch.init_device_mesh()
        if static:
            cache = transformers.StaticCache(config=cfg, max_cache_len=context)
            for layer in cache.layers:
                layer.lazy_initialization(*[kbtorch.distribute_tensor(torch.empty(
                    batch, cfg.num_key_value_heads, 1, head, dtype=torch.bfloat16, device="ahbm"),
                    mesh, [kbtorch.Shard(1)] * 2) for _ in range(2)])
        else:
            cache = transformers.DynamicCache(config=cfg)
            for layer in range(cfg.num_hidden_layers):
                kv = [kbtorch.distribute_tensor(torch.empty(batch, cfg.num_key_value_heads, context - 1, head,
                                                            dtype=torch.bfloat16, device="ahbm"),
                                                mesh, [kbtorch.Shard(1)] * 2) for _ in range(2)]
                cache.update(*kv, layer)
        ids = torch.randint(2, cfg.vocab_size, (batch, 1)).to("ahbm")
        where = torch.tensor([context - 1]).to("ahbm")
        with kbtorch.profile() as prof, (kbtorch.graph(name=f"{name} decode") if graph else nullcontext()):
            model(ids, past_key_values=cache, use_cache=True, cache_position=where)
        ns = sum(r.latency_ns for r in prof.records)
        kernels = [p for r in prof.records for p in r.parts] if graph else prof.records
        moved = sum(r.latency_ns for r in kernels if r.name.startswith("redistribute")) \
            / max(1e-9, sum(r.latency_ns for r in kernels)) * ns
        peak = machine.hbm_gbps(range(len(machine.pes)))
    nbytes = step_bytes(model, batch, context)
    top = {}
    for r in kernels:
        top[r.name] = top.get(r.name, 0.0) + r.latency_ns
    return dict(model=name, topology=topology, plan=plan, batch=batch, context=context, ns=ns, graph=graph,
                top={k: round(v) for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:8]},
                tokens_per_s=batch * 1e9 / ns, pct_hbm_roofline=100 * nbytes / ns / peak,
                collective_share=moved / ns, wall_s=time.perf_counter() - t0)


def tp_rows(targets: list) -> list:
    """Llama-3-70B on maia200_x8, TP 8, batch 16: the prompt 128 + 8 tokens run (wall,
    tokens/s) and one decode step at L = 4096 (``decode_point``) with a StaticCache (the
    target) and with the DynamicCache."""
    short = generate(*TP_RUN, "--prompt-len", "128", "--new-tokens", "8")
    point, dynamic, graph = decode_point(static=True), decode_point(), decode_point(static=True, graph=True)
    print(f"llama3-70b TP 8 on maia200_x8, batch 16, prompt 128 + 8 tokens: {short['tpot_ns'] / 1e3:.1f} us a token "
          f"= {short['decode_tokens_per_s']:.0f} tokens/s, {100 * short['collective_share']:.1f}% of the time in "
          f"collectives, {short['wall_s']:.0f} s wall")
    for what, r in (("StaticCache", point), ("DynamicCache", dynamic), ("StaticCache, graph mode", graph)):
        print(f"  decode step at L = {r['context']}, {what}: {r['ns'] / 1e3:.1f} us = {r['tokens_per_s']:.0f} tokens/s, "
              f"{r['pct_hbm_roofline']:.1f}% of the HBM roofline, {100 * r['collective_share']:.1f}% in "
              f"collectives ({r['wall_s']:.0f} s wall); most time: {r['top']}")
    targets.append(target("Llama-3-70B decode on maia200_x8, TP 8, batch 16, L = 4096 (StaticCache): "
                          "% of HBM roofline >= 60",
                          f"eager {point['pct_hbm_roofline']:.1f}% ({point['tokens_per_s']:.0f} tokens/s, "
                          f"{100 * point['collective_share']:.1f}% in collectives), graph "
                          f"{graph['pct_hbm_roofline']:.1f}% ({graph['tokens_per_s']:.0f} tokens/s)",
                          max(point["pct_hbm_roofline"], graph["pct_hbm_roofline"]) >= 60))
    targets.append(target("Llama-3-70B TP 8 on maia200_x8, prompt 128 + 8 tokens: wall <= 120 s",
                          f"{short['wall_s']:.0f} s ({short['decode_tokens_per_s']:.0f} tokens/s)",
                          short["wall_s"] <= 120))
    return [short, point, dynamic, graph]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the full-size decode runs")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    checks = [hbm_check(*row) for row in REFUSED]
    targets = []
    for c in checks:
        what = f"{c['model']} ({c['gb']:.1f} GB bf16"
        if c["cache"]:
            what += f" + KV cache of batch {c['cache'][0]} x {c['cache'][1]} positions, {c['cache_gb']:.1f} GB"
        print(f"{what}) on {c['topology']} ({c['hbm_gb']:.1f} GB): "
              f"{'HbmFull in %.2f s: %s' % (c['seconds'], c['refused']) if c['refused'] else 'fits'}")
        targets.append(target(f"{what}) on one {c['topology']}: HbmFull before any work",
                              f"HbmFull in {c['seconds']:.2f} s" if c["refused"] else f"fits ({c['gb']:.1f} GB)",
                              bool(c["refused"]) and c["seconds"] < 5))
    tiny = [generate(name, "--check", "--prompt-len", "8", "--new-tokens", "2", "--batch", "2") for name in TINY]
    for r in tiny:
        targets.append(target(f"{r['model']}: greedy tokens equal CPU",
                              str(r["tokens_match_cpu"]),
                              r["tokens_match_cpu"]))
    payload = dict(hbm=checks, tiny=tiny)
    if not args.quick:
        full = [generate(name, "--topology", topo, "--prompt-len", "4", "--new-tokens", "2") for name, topo in FULL]
        for (name, topo), r in zip(FULL, full):
            step = r["decode_steps"][0]
            print(f"{name} on {topo}: {r['tpot_ns'] / 1e3:.1f} us a token, {step['pct_hbm_roofline']:.1f}% of the HBM "
                  f"roofline, {r['wall_s']:.0f} s wall")
            targets.append(target(f"{name} full-size decode runs on {topo}",
                                  f"{r['tpot_ns'] / 1e3:.0f} us/token, {step['pct_hbm_roofline']:.1f}% HBM",
                                  r["tpot_ns"] > 0))
        payload["full"] = full
        payload["ep"] = ep = ep_row()
        print(f"mixtral-8x7b on maia200_x8, EP 8: {ep['decode_tokens_per_s']:.0f} tokens/s, {ep['pct_all_to_all']:.1f}% "
              f"in all-to-all, {ep['experts_routed_per_layer']} experts routed a layer, "
              f"{ep['pct_expert_hbm_bytes']:.1f}% of expert weight bytes in the expert kernels' HBM traffic, {ep['wall_s']:.0f} s wall")
        targets.append(target("Mixtral-8x7B on maia200_x8 with EP 8: runs; all-to-all visible; only routed "
                              "experts read",
                              f"{ep['decode_tokens_per_s']:.0f} tokens/s, {ep['pct_all_to_all']:.1f}% all-to-all, "
                              f"{ep['experts_routed_per_layer']}/8 experts, {ep['pct_expert_hbm_bytes']:.1f}% "
                              f"of expert bytes",
                              ep["pct_all_to_all"] > 0 and ep["experts_routed_per_layer"] == 2
                              and 20 < ep["pct_expert_hbm_bytes"] < 30))
        payload["tp"] = tp_rows(targets)
    finish(targets, t0, args.json, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
