"""Graph mode (issue 22) against eager: Qwen2.5-7B decode and prefill, timing-only.

- **(a) layer decode**, AHBM, batch 1, L = 4096: ``examples/qwen_layer.py --mode both``
  (28 x the layer + the LM head, each mode; % of the HBM roofline), and the whole 28-layer
  model captured as one graph (``bench_qwen``'s decode point inside ``kbtorch.graph()``);
- **(b) hf decode**, ``examples/hf_generate.py --model qwen2.5-7b --cache static``, prompt
  128: eager (8 new tokens) and graph (128 new tokens: the wall and peak targets); % of the
  HBM roofline of the last decode step, wall seconds, peak memory; graph mode with a
  ``DynamicCache`` (32 new tokens): how many steps were re-timed instead of simulated;
- **(c) TTFT**, prompt 2048 (``hf_generate --new-tokens 1``), eager and graph (``--ttft-layers
  N``: the model with N decoder layers, a config.json written for it; default all 28); in
  graph mode the overlap of collectives and GEMMs in the prefill graph: the time some
  collective kernel and some GEMM kernel run at once (``overlap_us``), and the chunked
  kernels (``tensor/graph/overlap.py``);
- **(d) Maia 200**, decode batch 16, L = 16384 (``qwen_layer --topology maia200``), both
  modes (docs/validation.md).

Each point runs in a fresh process (``--point``): its wall seconds include every kernel it
simulates for the first time, its peak memory (``ru_maxrss``) is its own. Nothing is
asserted: the targets block prints PASS/FAIL. ``--quick``: (a) and (b) only.

    python benchmarks/bench_graph.py [--quick] [--json PATH]
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
sys.path.insert(0, str(ROOT / "benchmarks"))

TARGETS = {"layer_pct_hbm": 80.0, "hf_pct_hbm": 78.0, "hf_wall_s": 60.0, "peak_gb": 2.0}


def layer_point(topology: str, batch: int, kv_len: int) -> dict:
    import kbtorch
    import qwen_layer
    kbtorch.use(topology)
    out = {}
    for mode in ("eager", "graph"):
        t0 = time.perf_counter()
        args = qwen_layer.parse(["--kv-len", str(kv_len), "--batch", str(batch)])
        prof, o, ref = qwen_layer.run_layer(args, graph=mode == "graph")
        rec = qwen_layer.report(args, prof, o, ref, time.perf_counter() - t0)
        out[mode] = {k: rec[k] for k in ("latency_ns", "token_ns", "tokens_per_s", "pct_hbm", "wall_s")}
    return {"kind": "layer", "topology": topology, "batch": batch, "kv_len": kv_len, **out}


def model_point(kv_len: int) -> dict:
    """The whole 28-layer model (``bench_qwen``'s decode point) as ONE graph."""
    import bench_qwen
    rec = bench_qwen.decode_point(kv_len, graph=True)
    del rec["ops"]
    return rec


COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")


def overlap_ns(graph_record) -> float:
    """The time some collective kernel and some GEMM kernel of a graph run at once (the
    union of their pairwise overlaps), from the graph's parts (its kernels' spans: from
    when their dependencies finished to when they did, queueing behind an earlier kernel on
    an engine included, so an upper bound)."""
    parts = graph_record.parts
    colls = [(p.start_ns, p.start_ns + p.latency_ns) for p in parts if p.kernel.startswith(COLLECTIVES)]
    gemms = [(p.start_ns, p.start_ns + p.latency_ns) for p in parts if "gemm" in p.kernel]
    spans = sorted((max(a, c), min(b, d)) for a, b in colls for c, d in gemms if min(b, d) > max(a, c))
    total, end = 0.0, float("-inf")
    for lo, hi in spans:
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def model_config(layers: int) -> str:
    """Qwen2.5-7B with ``layers`` decoder layers: a config.json in a temporary folder."""
    import tempfile
    from kbtorch.models.hf import config
    cfg = config("qwen2.5-7b").to_dict()
    cfg["num_hidden_layers"] = layers
    cfg.pop("layer_types", None)
    path = Path(tempfile.mkdtemp(prefix="bench_graph_")) / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def hf_point(mode: str, prompt: int, new: int, layers: int = 28, cache: str = "static", fidelity: str = "auto") -> dict:
    import hf_generate
    from kbtorch import use_fidelity
    t0 = time.perf_counter()
    model = "qwen2.5-7b" if layers == 28 else model_config(layers)
    args = hf_generate.parse(["--model", model, "--prompt-len", str(prompt), "--new-tokens", str(new),
                              "--cache", cache, "--mode", mode, "--timing-only"])
    with use_fidelity(fidelity):
        ran = hf_generate.run(args, graph=mode == "graph")
        rec = hf_generate.report(args, *ran, time.perf_counter() - t0)
    steps = rec["decode_steps"]
    out = {"kind": "hf", "mode": mode, "cache": cache, "fidelity": fidelity, "layers": layers, "prompt": prompt,
           "new_tokens": new,
           "ttft_us": rec["ttft_ns"] / 1000, "tpot_us": rec["tpot_ns"] / 1000 if rec["tpot_ns"] else None,
           "last_pct_hbm": steps[-1]["pct_hbm_roofline"] if steps else None, "graphs": rec.get("graphs"),
           "wall_s": rec["wall_s"]}
    prefill = next((r for r in ran[0].records if r.parts), None)
    if prefill is not None:
        out.update(prefill_overlap_us=overlap_ns(prefill) / 1000,
                   chunked=sorted({p.kernel for p in prefill.parts if "[chunk" in p.kernel}))
    return out


def run_point(*spec) -> dict:
    out = subprocess.run([sys.executable, __file__, "--point", *map(str, spec)], capture_output=True, text=True,
                         cwd=ROOT)
    if out.returncode:
        raise SystemExit(f"{spec} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _point(spec: list) -> dict:
    kind = spec[0]
    if kind == "layer":
        rec = layer_point(spec[1], int(spec[2]), int(spec[3]))
    elif kind == "model":
        rec = model_point(int(spec[1]))
    else:
        rec = hf_point(spec[1], int(spec[2]), int(spec[3]), int(spec[4]) if len(spec) > 4 else 28, *spec[5:])
    rec["peak_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return rec


def main(argv=None) -> int:
    from _report import finish
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="(a) and (b) only")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--ttft-layers", type=int, default=28, metavar="N",
                    help="(c): the model with N decoder layers (default 28: all)")
    ap.add_argument("--point", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.point:
        print(json.dumps(_point(args.point)))
        return 0
    t0 = time.perf_counter()
    layer = run_point("layer", "ahbm", 1, 4096)
    whole = run_point("model", 4096)
    print(json.dumps(layer), json.dumps(whole))
    hf = {m: run_point("hf", m, 128, n) for m, n in (("eager", 8), ("graph", 128))}
    hf["dynamic"] = run_point("hf", "graph", 128, 32, 28, "dynamic")
    print(json.dumps(hf))
    recs = {"layer": layer, "model": whole, "hf": hf}
    targets = [
        {"target": f"AHBM 7B decode L=4096: graph >= {TARGETS['layer_pct_hbm']}% of HBM roofline "
                   f"(eager {layer['eager']['pct_hbm']:.1f}%): 28 x layer graph",
         "measured": f"{layer['graph']['pct_hbm']:.1f}%", "pass": layer["graph"]["pct_hbm"] >= TARGETS["layer_pct_hbm"]},
        {"target": "... the whole model as one graph", "measured": f"{whole['pct_hbm']:.1f}%",
         "pass": whole["pct_hbm"] >= TARGETS["layer_pct_hbm"]},
        {"target": f"hf_generate --cache static: graph >= {TARGETS['hf_pct_hbm']}% (eager {hf['eager']['last_pct_hbm']:.1f}%)",
         "measured": f"{hf['graph']['last_pct_hbm']:.1f}%", "pass": hf["graph"]["last_pct_hbm"] >= TARGETS["hf_pct_hbm"]},
        {"target": f"hf_generate prompt 128 new 128 --mode graph: wall <= {TARGETS['hf_wall_s']} s",
         "measured": f"{hf['graph']['wall_s']:.1f} s", "pass": hf["graph"]["wall_s"] <= TARGETS["hf_wall_s"]},
        {"target": f"... peak <= {TARGETS['peak_gb']} GB", "measured": f"{hf['graph']['peak_gb']:.2f} GB",
         "pass": hf["graph"]["peak_gb"] <= TARGETS["peak_gb"]},
        {"target": "hf_generate --cache dynamic --mode graph, prompt 128, 32 new tokens: steps re-timed "
                   "(only what changed simulated)",
         "measured": f"{hf['dynamic']['wall_s']:.1f} s, {hf['dynamic']['peak_gb']:.2f} GB; graphs {hf['dynamic']['graphs']}",
         "pass": hf["dynamic"]["graphs"]["retimed"] > 0}]
    if not args.quick:
        ttft = {m: run_point("hf", m, 2048, 1, args.ttft_layers) for m in ("eager", "graph")}
        maia = run_point("layer", "maia200", 16, 16384)
        print(json.dumps(ttft), json.dumps(maia))
        recs.update(ttft=ttft, maia=maia)
        layers = "" if args.ttft_layers == 28 else f", {args.ttft_layers} of 28 layers"
        targets.append({"target": f"TTFT prompt 2048{layers}: graph < eager ({ttft['eager']['ttft_us']:.0f} us)",
                        "measured": f"{ttft['graph']['ttft_us']:.0f} us",
                        "pass": ttft["graph"]["ttft_us"] < ttft["eager"]["ttft_us"]})
        targets.append({"target": "... collectives overlap GEMMs in the prefill graph (chunked: tensor/graph/overlap.py)",
                        "measured": f"{ttft['graph']['prefill_overlap_us']:.1f} us overlapped, "
                                    f"{len(ttft['graph']['chunked'])} chunked kernel kinds",
                        "pass": ttft["graph"]["prefill_overlap_us"] > 0 and bool(ttft["graph"]["chunked"])})
        targets.append({"target": f"Maia 200 decode batch 16 L=16384 (eager {maia['eager']['tokens_per_s']:.0f} tokens/s)",
                        "measured": f"graph {maia['graph']['tokens_per_s']:.0f} tokens/s", "pass": True})
    finish(targets, t0, args.json, recs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
