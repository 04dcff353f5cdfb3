"""Maia 200 paper figures reproduced on the simulator: GEMM rooflines (Fig. 4 bf16, Fig. 5 fp8),
the 8-chip all-gather (Fig. 8) and Qwen2.5-7B decode at 16384 context on one chip.

    python examples/maia200_paper.py            # every figure (PNG under docs/validation/), a table
    python examples/maia200_paper.py --quick    # fewer points (under 2 minutes), no PNG unless --plots DIR
    python examples/maia200_paper.py --json     # one JSON object instead of the table

Run time on a 2-core machine: about 6 minutes in all, 1.5 minutes with ``--quick`` (the
progress bar is on stderr). GEMM points are simulated where the analytic model's estimate
is at most ``SIM_NS`` (100 us); longer ones (the 1 GiB logits in bf16, bf16 up/gate/down at
S=2048, the bf16 4096 cube) would take 20-75 s each, so they are plotted as analytic
estimates and left out of the summary. Simulated arithmetic intensity thus covers
1-1024 flop/byte in bf16 (ridge ~169; the estimates reach 1365) and 2-2291 in fp8
(ridge ~674): both the memory-bound side with the 50%-bandwidth crossing and the
compute-bound side of each roofline.

Every hardware number comes from the machines (kbtorch/topologies/maia200.toml, maia200_x8.toml);
the paper's reported figures are in PAPER, for the comparison only. See docs/validation.md.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import kbtorch
from kbtorch.cli import ArgumentParser, run_script
from kbtorch.ops.collective import all_gather
from kbtorch.ops.contract import DTYPES
from kbtorch.ops.gemm import gemm
from kbtorch.ops.gemm_model import candidates
from kbtorch.topology import load_machine

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qwen_layer  # noqa: E402  (the Qwen2 example's layer run and report)

OUT = Path(__file__).resolve().parents[1] / "docs" / "validation"
MIB = 1 << 20
#: GEMMs whose analytic estimate is longer than this (ns) are not simulated (the estimate is
#: plotted, not counted): simulation wall time grows with simulated time (~0.1-0.3 s per us).
SIM_NS = 100_000
#: The paper's reported results (not hardware facts: what we compare against).
PAPER = {"bf16_pct_peak": 99.69, "bf16_pct_bw": 51.4, "fp8_pct_peak": 96.0, "fp8_pct_bw": 56.0,
         "bw50_mib": 113.5, "ag_break_even_mib": 9.0, "ag_pct_bw_bound": 94.0, "ag_pct_lat_bound": 78.0,
         "ag_latency_us": 4.0, "decode_tokens_per_s": 2434.0, "decode_pct_max": 70.0}
#: Qwen2.5-7B GEMMs of the paper's Table I as (name, N out, K): C[S, N] = X[S, K] @ W[K, N].
TABLE1 = (("k/v proj", 512, 3584), ("q/o proj", 3584, 3584), ("up/gate proj", 18944, 3584),
          ("down proj", 3584, 18944), ("logits", 151936, 3584))


def gemm_shapes(quick: bool) -> list[tuple[str, int, int, int]]:
    """(label, M, N, K): Table I at several S, and square shapes reaching high intensity."""
    seqs = (1, 256) if quick else (1, 16, 128, 512, 2048)
    out = [(f"{name} S={s}", s, n, k) for s in seqs for name, n, k in TABLE1
           if not (name == "logits" and s > 16)]
    out += [("k/v proj S=16384", 16384, 512, 3584)]
    cubes = (2048,) if quick else (1024, 2048, 3072, 4096)
    return out + [(f"square {c}", c, c, c) for c in cubes]


def best_estimate(machine, m, n, k, dtype):
    """The analytic model's best tiling and its estimate (no simulation)."""
    return candidates(machine, m, n, k, dtype, list(range(len(machine.pes))), "bf16")[0]


def run_gemm(machine, label, m, n, k, dtype, sim_ns: float) -> dict:
    """Simulated if the analytic estimate is at most ``sim_ns`` (simulation cost grows with
    the simulated time), else the analytic estimate alone (``simulated`` False)."""
    out_dtype, rate = "bf16", "fp8" if dtype.startswith("fp8") else dtype
    est, tiling = best_estimate(machine, m, n, k, dtype)
    size = (m * k + k * n) * DTYPES[dtype].bytes + m * n * DTYPES[out_dtype].bytes
    flops, bw = 2 * m * n * k, machine.hbm_gbps(range(len(machine.pes)))
    if est.ns <= sim_ns:
        run = gemm(shape=(m, n, k), dtype=dtype, out_dtype=out_dtype, machine=machine, mode="coarse")
        ns, plan, bound = run.latency_ns, run.plan, run.bottleneck
    else:
        ns, plan, bound = est.ns, tiling.describe(), est.bound
    return {"label": label, "m": m, "n": n, "k": k, "dtype": dtype, "simulated": est.ns <= sim_ns,
            "latency_ns": ns, "analytic_ns": est.ns, "flops": flops, "bytes": size, "ai": flops / size,
            "tflops": flops / ns / 1000, "pct_peak": 100 * flops / ns / 1000 / machine.peak_tflops(rate),
            "gbps": size / ns, "pct_bw": 100 * size / ns / bw, "plan": plan, "bottleneck": bound}


def gemm_summary(points: list, ridge: float) -> dict:
    """Best % of peak above the ridge, best % of HBM bandwidth below it, and the operand
    size above which every memory-bound point exceeds 50% of the bandwidth."""
    sim = [p for p in points if p["simulated"]]
    comp = [p for p in sim if p["ai"] >= ridge]
    mem = sorted((p for p in sim if p["ai"] < ridge), key=lambda p: p["bytes"])
    below = [p["bytes"] for p in mem if p["pct_bw"] <= 50]
    above = [p["bytes"] for p in mem if p["pct_bw"] > 50 and (not below or p["bytes"] > max(below))]
    return {"ridge": ridge, "pct_peak": max((p["pct_peak"] for p in comp), default=None),
            "pct_bw": max((p["pct_bw"] for p in mem), default=None),
            "bw50_mib": min(above) / MIB if above else None}


def ag_sizes(quick: bool) -> list[int]:
    kib = [1, 256, 4096, 16384] if quick else [1, 4, 16, 64, 256, 1024, 4096, 9216, 16384, 65536, 262144, 512000]
    return [x * 1024 for x in kib]


def run_allgather(machine, per_chip: int, algo: str) -> dict:
    p = len(machine.pes)
    run = all_gather(group="all", nbytes=per_chip * p, algo=algo, machine=machine)
    received = per_chip * (p - 1)
    # NOTE: the paper's speed of light: max(4 us, R / 1.4 TiB/s), R = N (P - 1); the 4 us is
    # its latency estimate, 1.4 TiB/s its bandwidth figure (PAPER, not hardware facts).
    lat_ns, bw = PAPER["ag_latency_us"] * 1000, 1.4 * 2**40 / 1e9
    sol = max(lat_ns, received / bw)
    return {"per_chip": per_chip, "received": received, "algo": algo, "latency_ns": run.latency_ns,
            "gbps": received / run.latency_ns,
            "sol_ns": sol, "pct_sol": 100 * sol / run.latency_ns, "bw_bound": received / bw >= lat_ns}


def ag_summary(points: list) -> dict:
    by = {(p["algo"], p["per_chip"]): p for p in points}
    sizes = sorted({p["per_chip"] for p in points})
    ring_wins = [s for s in sizes if by[("ring", s)]["latency_ns"] < by[("direct", s)]["latency_ns"]]
    best = [max(by[(a, s)]["pct_sol"] for a in ("direct", "ring")) for s in sizes]
    return {"break_even_mib": ring_wins[0] / MIB if ring_wins else None,
            "pct_bw_bound": max((b for b, s in zip(best, sizes) if by[("ring", s)]["bw_bound"]), default=None),
            "pct_lat_bound": max((b for b, s in zip(best, sizes) if not by[("ring", s)]["bw_bound"]), default=None)}


def run_decode(batch: int, kv_len: int) -> dict:
    args = qwen_layer.parse(["--kv-len", str(kv_len), "--batch", str(batch)])
    prof, out, ref = qwen_layer.run_layer(args)
    rec = qwen_layer.report(args, prof, out, ref, 0.0)
    machine = kbtorch.current_machine()
    cfg = qwen_layer.CONFIGS["7b"]
    weights = rec["hbm_bytes_per_token"] - cfg.layers * 2 * batch * cfg.kv_heads * (kv_len + 1) * cfg.head_dim * 2
    kv = rec["hbm_bytes_per_token"] - weights
    # NOTE: the estimated maximum: weights once and every sequence's KV cache per step at the
    # machine's HBM bandwidth (the memory-bound limit of decode).
    max_tps = batch * machine.hbm_gbps(range(len(machine.pes))) * 1e9 / (weights + kv)
    return {"batch": batch, "tokens_per_s": rec["tokens_per_s"], "max_tokens_per_s": max_tps,
            "pct_max": 100 * rec["tokens_per_s"] / max_tps, "token_us": rec["token_ns"] / 1000,
            "weights_gib": weights / 2**30, "kv_mib_per_seq": kv / batch / MIB}


def plot(results: dict, machines: dict, out: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    out.mkdir(parents=True, exist_ok=True)
    files = []
    chip = machines["chip"]
    for dtype, rate, fig in (("bf16", "bf16", "fig4"), ("fp8_e4m3", "fp8", "fig5")):
        pts = results["gemm"][dtype]["points"]
        peak, bw = chip.peak_tflops(rate), chip.hbm_gbps(range(len(chip.pes))) / 1000
        ais = [10 ** (i / 20) for i in range(20 * 1, 20 * 4 + 1)]
        f, ax = plt.subplots(figsize=(6, 4))
        ax.plot(ais, [min(peak, a * bw) for a in ais], "k-", label="roofline (machine)")
        for sim, mark, name in ((True, "o", "simulated"), (False, "x", "analytic estimate (not simulated)")):
            mine = [p for p in pts if p["simulated"] == sim]
            if mine:
                ax.scatter([p["ai"] for p in mine], [p["tflops"] for p in mine], s=14, marker=mark, label=name)
        ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity [flop/byte]", ylabel=f"{rate} TFLOP/s",
               title=f"Maia 200 {rate} GEMM ({fig[:3].title()}. {fig[3:]} of the paper)")
        ax.legend()
        files.append(_save(f, out / f"{fig}_{rate}_roofline.png"))
    pts = results["allgather"]["points"]
    f, ax = plt.subplots(figsize=(6, 4))
    for algo in ("direct", "ring"):
        mine = [p for p in pts if p["algo"] == algo]
        ax.plot([p["per_chip"] for p in mine], [p["gbps"] / 1.073741824 for p in mine], "o-", label=f"{algo} all-gather")
    sol = [p for p in pts if p["algo"] == "ring"]
    ax.plot([p["per_chip"] for p in sol], [p["received"] / p["sol_ns"] / 1.073741824 for p in sol], "k--",
            label="speed of light")
    ax.set(xscale="log", yscale="log", xlabel="all-gather size per chip [bytes]", ylabel="GiB/s received per chip",
           title="Maia 200 x8 all-gather (Fig. 8 of the paper)")
    ax.legend()
    files.append(_save(f, out / "fig8_allgather.png"))
    dec = results["decode"]["points"]
    f, ax = plt.subplots(figsize=(6, 4))
    ax.plot([d["batch"] for d in dec], [d["tokens_per_s"] for d in dec], "o-", label="simulated")
    ax.plot([d["batch"] for d in dec], [d["max_tokens_per_s"] for d in dec], "k--", label="HBM-bound maximum")
    ax.axhline(PAPER["decode_tokens_per_s"], color="r", ls=":", label="paper (batch not stated)")
    ax.set(xscale="log", xlabel="batch", ylabel="tokens/s", title="Qwen2.5-7B decode, 16384 context, one chip")
    ax.legend()
    files.append(_save(f, out / "decode_qwen7b.png"))
    return files


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def run_all(quick: bool, progress: bool, plots: Path | None = None) -> dict:
    from tqdm import tqdm
    chip, x8 = load_machine("maia200"), load_machine("maia200_x8")
    shapes = gemm_shapes(quick)
    sizes = ag_sizes(quick)
    batches = (16,) if quick else (1, 4, 8, 16, 32)
    tasks = [("gemm", d, s) for d in ("bf16", "fp8_e4m3") for s in shapes]
    tasks += [("ag", a, s) for s in sizes for a in ("direct", "ring")] + [("decode", b, None) for b in batches]
    res = {"gemm": {"bf16": {"points": []}, "fp8_e4m3": {"points": []}}, "allgather": {"points": []},
           "decode": {"points": []}}
    kbtorch.use("maia200")
    for kind, a, b in tqdm(tasks, disable=not progress, desc="maia200 paper", unit="run"):
        t0 = time.perf_counter()
        if kind == "gemm":
            point = run_gemm(chip, *b, a, SIM_NS)
            res["gemm"][a]["points"].append(point)
        elif kind == "ag":
            point = run_allgather(x8, b, a)
            res["allgather"]["points"].append(point)
        else:
            point = run_decode(a, 16384)
            res["decode"]["points"].append(point)
        point["wall_s"] = time.perf_counter() - t0
    bw = chip.hbm_gbps(range(len(chip.pes))) / 1000
    for dtype, rate in (("bf16", "bf16"), ("fp8_e4m3", "fp8")):
        res["gemm"][dtype].update(gemm_summary(res["gemm"][dtype]["points"], chip.peak_tflops(rate) / bw))
    res["allgather"].update(ag_summary(res["allgather"]["points"]))
    best = max(res["decode"]["points"], key=lambda d: d["tokens_per_s"])
    res["decode"].update(best_batch=best["batch"], tokens_per_s=best["tokens_per_s"], pct_max=best["pct_max"])
    res["plots"] = plot(res, {"chip": chip}, plots) if plots else []
    return res


def comparison(res: dict) -> list[tuple[str, float | None, float]]:
    g, ag, dec = res["gemm"], res["allgather"], res["decode"]
    return [("Fig. 4 bf16 best % of peak (compute-bound)", g["bf16"]["pct_peak"], PAPER["bf16_pct_peak"]),
            ("Fig. 4 bf16 best % of HBM BW (memory-bound)", g["bf16"]["pct_bw"], PAPER["bf16_pct_bw"]),
            ("Fig. 4 operand MiB above which BW > 50%", g["bf16"]["bw50_mib"], PAPER["bw50_mib"]),
            ("Fig. 5 fp8 best % of peak (compute-bound)", g["fp8_e4m3"]["pct_peak"], PAPER["fp8_pct_peak"]),
            ("Fig. 5 fp8 best % of HBM BW (memory-bound)", g["fp8_e4m3"]["pct_bw"], PAPER["fp8_pct_bw"]),
            ("Fig. 8 break-even size direct/ring (MiB)", ag["break_even_mib"], PAPER["ag_break_even_mib"]),
            ("Fig. 8 best % of bandwidth bound", ag["pct_bw_bound"], PAPER["ag_pct_bw_bound"]),
            ("Fig. 8 best % of latency bound", ag["pct_lat_bound"], PAPER["ag_pct_lat_bound"]),
            (f"Decode tokens/s (best batch {dec['best_batch']})", dec["tokens_per_s"], PAPER["decode_tokens_per_s"]),
            ("Decode % of estimated maximum", dec["pct_max"], PAPER["decode_pct_max"])]


def table(res: dict) -> str:
    lines = [f"{'figure':48s} {'ours':>10s} {'paper':>10s} {'diff %':>8s}"]
    for name, ours, paper in comparison(res):
        diff = f"{100 * (ours - paper) / paper:+8.1f}" if ours is not None else "     n/a"
        lines.append(f"{name:48s} {'none' if ours is None else f'{ours:10.2f}':>10s} {paper:10.2f} {diff}")
    lines.append("plots: " + ", ".join(res["plots"]))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer points (under 2 minutes)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--plots", metavar="DIR", type=Path,
                    help=f"write the PNG figures there (default: {OUT.relative_to(OUT.parents[1])} for the full run, "
                         f"none with --quick, so that a quick run never replaces the published figures)")
    args = ap.parse_args(argv)
    plots = args.plots or (None if args.quick else OUT)
    t0 = time.perf_counter()
    res = run_all(args.quick, progress=True, plots=plots)  # the bar is on stderr
    res["wall_s"] = time.perf_counter() - t0
    res["comparison"] = [{"figure": n, "ours": o, "paper": p} for n, o, p in comparison(res)]
    print(json.dumps(res) if args.json else table(res) + f"\nwall {res['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
