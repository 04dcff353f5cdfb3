"""Serving benchmark (issue 43): the simulated step model's cost and error, and the serving
loop's checks, with every figure of the issue's targets table.

    python benchmarks/bench_serve.py [--quick] [--json [PATH]]

Cases, in this order (the first starts from an empty memo of simulated shapes):
- **cold**: Qwen2.5-7B on maia200, the first ``--requests`` (1000; ``--quick`` 200) requests of
  the shipped Azure conversation trace rescaled to ``--qps``, served by vLLM's scheduler with
  the KV blocks the chip's HBM leaves; the step model built from nothing (its held-out
  shapes simulated too), the shapes a batch first needs simulated side by side over
  ``--workers`` processes (2). Wall seconds.
- **warm**: the same run again, every shape in the memo: simulated seconds over wall seconds
  (the real-time factor; BLIS's anchor is 200x).
- **step model error**: the tables against direct simulation of the held-out shapes.
- **single request**: one request of ``--prompt`` tokens and ``--new`` outputs served alone,
  against ``examples/hf_generate.py`` on the same machine: TTFT and TPOT.
- **M/D/1**: constant steps, one request at a time, Poisson arrivals at rho 0.5: the mean
  wait against lambda D^2 / (2 (1 - rho)).
- **70B capacity** (not with ``--quick``): Llama-3-70B on maia200_x8 TP 8, the highest rate of
  the Azure conversation trace within MLPerf's Llama-2-70B server limits (TTFT 2 s, TPOT
  200 ms at P99), the study's budget of 2048 tokens a step, step model built from nothing.
  Wall seconds.

``--json`` alone prints one JSON object with every figure on stdout (the tables then go to
stderr); ``--json PATH`` writes it to PATH.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import finish, target  # noqa: E402

MLPERF = {"ttft": "2s", "tpot": "200ms"}


def azure_run(model, requests: int, qps: float):
    """(result, wall s) of the Azure conversation trace's first ``requests`` at ``qps``."""
    from kbtorch import serve
    wl = serve.rescale(serve.azure("azure-conv"), qps=qps, limit=requests)
    t = time.perf_counter()
    result = serve.run(wl, model, model.kv_blocks(), slos=MLPERF)
    return result, time.perf_counter() - t


def simulated_s(result) -> float:
    ends = [r.token_s[-1] for r in result.requests if r.token_s]
    return max(ends) - min(r.arrival_s for r in result.requests)


def single_request(model, prompt: int, new: int) -> dict:
    """One request alone through the loop against hf_generate's TTFT and TPOT."""
    from kbtorch import serve
    wl = serve.synthetic(1, qps=1.0, input_tokens=prompt, output_tokens=new)
    r = serve.run(wl, model, model.kv_blocks(), warmup=0.0, drain=0.0).requests[0]
    ttft = (r.token_s[0] - r.arrival_s) * 1e9
    tpot = (r.token_s[-1] - r.token_s[0]) * 1e9 / (new - 1)
    cmd = [sys.executable, str(ROOT / "examples" / "hf_generate.py"), "--model", model.model_name, "--topology",
           model.topology, "--prompt-len", str(prompt), "--new-tokens", str(new), "--json"]
    hf = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return {"prompt": prompt, "new": new, "serve_ttft_ns": ttft, "hf_ttft_ns": hf["ttft_ns"],
            "serve_tpot_ns": tpot, "hf_tpot_ns": hf["tpot_ns"],
            "ttft_error": ttft / hf["ttft_ns"] - 1, "tpot_error": tpot / hf["tpot_ns"] - 1}


def md1(n: int) -> dict:
    from kbtorch import serve
    step_s, rho = 0.01, 0.5
    lam = rho / step_s
    wl = serve.synthetic(n, qps=lam, input_tokens=1, output_tokens=1, seed=0)
    r = serve.run(wl, serve.ConstantStep(step_s * 1e9), kv_blocks=4, scheduler="static",
                  limits=serve.SchedulerConfig(max_num_seqs=1))
    theory = lam * step_s ** 2 / (2 * (1 - rho))
    return {"requests": n, "mean_wait_s": r.metrics["mean_wait_s"], "theory_s": theory,
            "error": r.metrics["mean_wait_s"] / theory - 1}


def capacity_70b(requests: int, workers: int) -> dict:
    from kbtorch import serve
    t = time.perf_counter()
    model = serve.SimulatedStep("llama3-70b", "maia200_x8", tp=8, held_out=(), workers=workers)
    blocks = model.kv_blocks()
    trace = serve.azure("azure-conv")
    # NOTE: the study's token budget (kbtorch/studies/serve_llama70b.toml): a step of 8192
    # tokens of the 70B model is itself longer than the 200 ms TPOT limit.
    limits = serve.SchedulerConfig(max_num_batched_tokens=2048)
    cap = serve.find_capacity(lambda qps: serve.run(serve.rescale(trace, qps=qps, limit=requests), model, blocks,
                                                    limits=limits, slos=MLPERF), MLPERF, qps=1.0, tolerance=0.05)
    model.close()
    return {"capacity_qps": cap.qps, "trials": len(cap.trials), "simulated_shapes": model.simulated,
            "wall_s": time.perf_counter() - t, "workers": workers}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="200 requests, M/D/1 of 50,000, no 70B capacity search")
    ap.add_argument("--json", nargs="?", const="-", metavar="PATH", help="one JSON object (stdout, or PATH)")
    ap.add_argument("--requests", type=int)
    ap.add_argument("--qps", type=float, default=1.0, help="the Azure trace's rate (default 1 request/s)")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2,
                    help="processes that simulate a cold step model's shapes side by side (default 2: this host's cores)")
    args = ap.parse_args(argv)
    requests = args.requests or (200 if args.quick else 1000)
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr) if args.json == "-" else contextlib.nullcontext():
        payload, targets = run_cases(args, requests)
        finish(targets, t0, None if args.json in (None, "-") else args.json, payload)
    if args.json == "-":
        print(json.dumps(dict(payload, targets=targets, wall_s=time.perf_counter() - t0)))
    return 0


def run_cases(args, requests: int) -> tuple:
    from kbtorch import serve
    t = time.perf_counter()
    model = serve.SimulatedStep("qwen2.5-7b", "maia200", workers=args.workers)
    cold, run_s = azure_run(model, requests, args.qps)
    cold_s = time.perf_counter() - t
    print(f"cold: {requests} Azure-conv requests at {args.qps} req/s, {model.simulated} shapes simulated "
          f"over {args.workers} processes, {cold_s:.1f} s wall; label {cold.metrics['label']}")
    warm, warm_s = azure_run(model, requests, args.qps)
    factor = simulated_s(warm) / warm_s
    print(f"warm: {simulated_s(warm):.1f} s simulated in {warm_s:.2f} s wall: {factor:.0f}x real time")
    err = model.error()
    print(f"step model: held-out median {err['median_rel_error']:.2%}, p95 {err['p95_rel_error']:.2%}")
    one = single_request(model, args.prompt, args.new)
    print(f"single request: TTFT {one['ttft_error']:+.3%}, TPOT {one['tpot_error']:+.3%} against hf_generate")
    queue = md1(50_000 if args.quick else 200_000)
    print(f"M/D/1: mean wait {queue['error']:+.2%} from theory")
    model.close()
    payload = {"cold": {"wall_s": cold_s, "serve_wall_s": run_s, "simulated_shapes": model.simulated, "workers": args.workers,
                        "metrics": cold.metrics},
               "warm": {"wall_s": warm_s, "simulated_s": simulated_s(warm), "real_time_factor": factor},
               "step_model_error": err, "single_request": one, "md1": queue}
    targets = [target(f"cold, {requests} requests <= 5 min", f"{cold_s:.0f} s", cold_s <= 300),
               target("warm >= 200x real time", f"{factor:.0f}x", factor >= 200),
               target("step model median <= 2%", f"{err['median_rel_error']:.2%}", err["median_rel_error"] <= 0.02),
               target("step model p95 <= 5%", f"{err['p95_rel_error']:.2%}", err["p95_rel_error"] <= 0.05),
               target("M/D/1 within 2%", f"{queue['error']:+.2%}", abs(queue["error"]) <= 0.02),
               target("single request TTFT, TPOT within 1% of hf_generate",
                      f"{one['ttft_error']:+.2%}, {one['tpot_error']:+.2%}",
                      max(abs(one["ttft_error"]), abs(one["tpot_error"])) <= 0.01)]
    if not args.quick:
        payload["capacity_70b"] = cap = capacity_70b(requests, args.workers)
        print(f"70B capacity: {cap['capacity_qps']:.3f} req/s in {cap['wall_s']:.0f} s")
        targets.append(target("70B capacity search <= 15 min", f"{cap['wall_s']:.0f} s", cap["wall_s"] <= 900))
    return payload, targets


if __name__ == "__main__":
    sys.exit(main())
