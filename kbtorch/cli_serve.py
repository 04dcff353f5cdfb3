"""``kbtorch serve``: serve a workload (a trace or synthetic requests) through a batch scheduler
on replicas of an engine, each step timed by a step model (``kbtorch.serve``); prints vLLM's
benchmark figures, ``--json`` one object, ``--csv PATH`` one row per request.
"""
from __future__ import annotations

import argparse

from .cli_common import _positive_int, check_output, positive_float

_RATE = positive_float()


def add_parser(sub, common) -> None:
    p = sub.add_parser("serve", parents=[common], help="serve requests through a scheduler (kbtorch.serve)",
                       description=__doc__.split("\n\n")[0].replace("``", "'"))
    w = p.add_argument_group("workload")
    w.add_argument("--trace", dest="workload_trace", metavar="NAME|PATH", help="azure-conv, azure-code (shipped), or a trace file")
    w.add_argument("--trace-kind", choices=("azure", "mooncake", "plain"), help="the trace's format (default: by name)")
    w.add_argument("--requests", type=_positive_int, default=1000, help="synthetic requests, or the first N of a trace")
    w.add_argument("--qps", type=_RATE, help="requests/s (a trace: rescaled to it)")
    w.add_argument("--arrival", choices=("poisson", "gamma", "constant"), default="poisson")
    w.add_argument("--burstiness", type=_RATE, default=1.0, help="gamma shape (vLLM's --burstiness)")
    w.add_argument("--input-tokens", type=_length, default="512", help="N, uniform:LO:HI or zipf:LO:HI:A")
    w.add_argument("--output-tokens", type=_length, default="128", help="N, uniform:LO:HI or zipf:LO:HI:A")
    w.add_argument("--concurrency", type=_positive_int, help="closed loop: this many requests outstanding")
    w.add_argument("--seed", type=int, default=0)
    e = p.add_argument_group("engine")
    e.add_argument("--scheduler", default="vllm", help="vllm, sarathi, orca, static")
    e.add_argument("--max-num-batched-tokens", type=_positive_int, default=8192)
    e.add_argument("--max-num-seqs", type=_positive_int, default=256)
    e.add_argument("--chunk-tokens", type=_positive_int, default=512, help="sarathi's chunk")
    e.add_argument("--kv-blocks", type=_positive_int, help="KV blocks per replica (default with --step simulated: "
                   "the replica's HBM x --hbm-utilization minus the weights)")
    e.add_argument("--hbm-utilization", type=_RATE, default=0.9, help="share of HBM for weights + KV (as vLLM)")
    e.add_argument("--block-tokens", type=_positive_int, default=16)
    e.add_argument("--no-prefix-caching", action="store_true")
    e.add_argument("--replicas", type=_positive_int, default=1)
    e.add_argument("--router", default="round-robin", help="round-robin, least-outstanding, kv-load, prefix-affinity")
    e.add_argument("--host-overhead-ns", type=float, default=0.0, help="host time added to every step")
    d = p.add_argument_group("prefill/decode disaggregation")
    d.add_argument("--pd-prefill", type=_positive_int, metavar="N", help="the first N of --replicas prefill, the "
                   "others decode; the KV moves between them (--step simulated: timed by the simulator between "
                   "replica 0's and replica 1's chips)")
    d.add_argument("--kv-links", type=_positive_int, default=1, help="links between the pools, one transfer each at a time")
    d.add_argument("--kv-link-gbps", type=_RATE, help="a KV link's GB/s (needed without --step simulated)")
    d.add_argument("--kv-link-latency-ns", type=float, default=0.0, help="with --kv-link-gbps: ns per transfer")
    d.add_argument("--kv-bytes-per-token", type=_positive_int, help="KV bytes of one position (default with --step "
                   "simulated: the model's)")
    s = p.add_argument_group("step model")
    s.add_argument("--step", choices=("constant", "table", "simulated"), default="constant")
    s.add_argument("--step-ns", type=float, default=20e6, help="--step constant: ns per step")
    s.add_argument("--step-table", metavar="CSV", help="--step table: new_tokens,context_tokens,step_ns")
    s.add_argument("--model", default="qwen2.5-7b", help="--step simulated: a kbtorch.models.hf preset or config")
    s.add_argument("--tp", type=_positive_int, help="--step simulated: tensor parallel over N chips")
    s.add_argument("--step-cache", metavar="SQLITE", help="--step simulated: read and keep simulated step times in "
                   "this file (a sweep's store works: table serve_steps), so a later run starts warm")
    s.add_argument("--step-workers", type=_positive_int, default=1, metavar="N",
                   help="--step simulated: simulate the shapes a batch first needs side by side in N processes "
                        "(this one and N-1 spawned; the same times, less wall)")
    o = p.add_argument_group("output")
    o.add_argument("--slo", action="append", default=[], metavar="NAME=VALUE", help="ttft=2s, tpot=200ms, e2el=...")
    o.add_argument("--warmup", type=float, default=0.1, help="share of requests left out first")
    o.add_argument("--drain", type=float, default=0.1, help="share of requests left out last")
    o.add_argument("--csv", metavar="PATH", help="write one row per request")
    o.add_argument("--chrome-trace", metavar="PATH", help="write the run's steps, KV share, queue and requests as a "
                   "Chrome/Perfetto trace (with --capacity: the run at the capacity)")
    o.add_argument("--plot", metavar="PNG", help="write a plot: the run's KV share and queue over time, or with "
                   "--capacity the P99 of each SLO against the rates tried")
    o.add_argument("--capacity", action="store_true", help="search the highest --qps (the start, default 1) that "
                   "meets every --slo: stable, nothing refused, each P99 within its limit")
    o.add_argument("--tolerance", type=_RATE, default=0.02, help="--capacity: stop when the rates that met and "
                   "failed are this close (relative)")
    p.set_defaults(func=_cmd_serve, needs_machine=False)



def _length(text: str):
    """``N`` -> N; ``uniform:LO:HI`` / ``zipf:LO:HI:A`` -> a dict of ``kbtorch.serve.lengths`` arguments."""
    parts = text.split(":")
    try:
        if len(parts) == 1:
            return int(parts[0])
        if parts[0] == "uniform" and len(parts) == 3:
            return {"kind": "uniform", "low": int(parts[1]), "high": int(parts[2])}
        if parts[0] == "zipf" and len(parts) == 4:
            return {"kind": "zipf", "low": int(parts[1]), "high": int(parts[2]), "a": float(parts[3])}
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"'{text}' is not N, uniform:LO:HI or zipf:LO:HI:A")


def _workload(args, serve):
    # NOTE: dest workload_trace: the command line's own --trace (the event trace) is another option.
    if args.workload_trace:
        wl = serve.trace(args.workload_trace, args.trace_kind)
        return serve.rescale(wl, qps=args.qps, limit=args.requests)
    if args.qps is None and args.concurrency is None:
        raise ValueError("argument --qps: synthetic requests need --qps or --concurrency")
    return serve.synthetic(args.requests, args.qps or 1.0, args.input_tokens, args.output_tokens, args.arrival,
                           args.seed, args.burstiness, args.concurrency)


def _step_model(args, serve):
    """(step model, KV blocks per replica)."""
    if args.step == "constant":
        model = serve.ConstantStep(args.step_ns)
    elif args.step == "table":
        if not args.step_table:
            raise ValueError("argument --step-table: --step table needs a CSV")
        model = serve.TableStep.read(args.step_table)
    else:
        from .serve.simulated import SimulatedStep
        model = SimulatedStep(args.model, getattr(args, "topology", None), args.tp, args.replicas,
                              cache=args.step_cache, workers=args.step_workers)
        if args.kv_blocks is None:
            return model, model.kv_blocks(args.hbm_utilization, args.block_tokens)
    if args.kv_blocks is None:
        raise ValueError(f"argument --kv-blocks: needed with --step {args.step}")
    return model, args.kv_blocks


def _slos(items: list) -> dict:
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"argument --slo: '{item}' is not NAME=VALUE (e.g. ttft=2s)")
        out[name.strip()] = value
    return out


def _cmd_serve(args, machine):
    from . import serve
    slos = _slos(args.slo)
    for name, value in slos.items():
        serve.parse_slo(name, value)
    inputs = {args.workload_trace: "the workload trace the run reads", args.step_table: "the step table the run reads",
              args.step_cache: "the step cache the run keeps"}
    if args.csv:
        check_output(args.csv, "--csv", inputs, "requests")
    if args.chrome_trace:
        check_output(args.chrome_trace, "--chrome-trace", inputs, "chrome")
    if args.plot:
        check_output(args.plot, "--plot", inputs, "png")
        serve.plots.pyplot()        # NOTE: refused before any simulation when matplotlib is missing
    if args.capacity and (not slos or args.concurrency is not None):
        raise ValueError("argument --capacity: needs at least one --slo" if not slos else
                         "argument --capacity: searches an open-loop rate (--qps), not a closed loop (--concurrency)")
    if args.step_cache and args.step != "simulated":
        raise ValueError(f"argument --step-cache: keeps simulated step times (--step simulated, not {args.step})")
    if args.step_workers != 1 and args.step != "simulated":
        raise ValueError(f"argument --step-workers: simulates step shapes (--step simulated, not {args.step})")
    model, blocks = _step_model(args, serve)
    try:
        return _serve_with(args, serve, slos, model, blocks)
    finally:
        getattr(model, "close", lambda: None)()


def _serve_with(args, serve, slos, model, blocks):
    limits = serve.SchedulerConfig(args.max_num_batched_tokens, args.max_num_seqs, args.chunk_tokens)
    pd = _disaggregation(args, serve, model)

    def serve_at(qps):
        wl = _workload(argparse.Namespace(**{**vars(args), "qps": qps}) if qps is not None else args, serve)
        return serve.run(wl, model, blocks, args.scheduler, limits, args.replicas, args.router, args.host_overhead_ns,
                         args.block_tokens, not args.no_prefix_caching, slos, args.warmup, args.drain, pd)
    if args.capacity:
        cap = serve.find_capacity(serve_at, slos, args.qps or 1.0, args.tolerance)
        if cap.best is not None:
            _write(args, cap.best)
        if args.plot:
            serve.plot_latency_qps({"capacity search": cap.trials}, args.plot, slos)
        return cap.to_json(), _capacity_text(cap)
    result = serve_at(None)
    _write(args, result)
    if args.plot:
        serve.plot_timeline(result, args.plot)
    return result.to_json(), _text(result)


def _disaggregation(args, serve, model):
    """The prefill/decode split of ``--pd-prefill`` (None without it)."""
    if args.pd_prefill is None:
        for flag in ("kv_link_gbps", "kv_bytes_per_token"):
            if getattr(args, flag) is not None:
                raise ValueError(f"argument --{flag.replace('_', '-')}: needs --pd-prefill")
        return None
    if args.pd_prefill >= args.replicas:
        raise ValueError(f"argument --pd-prefill: {args.pd_prefill} prefill replicas of --replicas {args.replicas} "
                         f"leave no decode replica")
    simulated = args.step == "simulated"
    if args.kv_link_gbps is not None:
        transfer = serve.LinkTransfer(args.kv_link_gbps, args.kv_link_latency_ns)
    elif simulated:
        transfer = model.kv_link()
    else:
        raise ValueError(f"argument --kv-link-gbps: --pd-prefill with --step {args.step} needs the KV links' GB/s")
    per_token = args.kv_bytes_per_token or (model.kv_bytes_per_token() if simulated else None)
    if per_token is None:
        raise ValueError(f"argument --kv-bytes-per-token: --pd-prefill with --step {args.step} needs it")
    return serve.Disaggregation(args.pd_prefill, transfer, per_token, args.kv_links)


def _write(args, result) -> None:
    if args.csv:
        result.write_csv(args.csv)
    if args.chrome_trace:
        result.export_chrome_trace(args.chrome_trace)


def _capacity_text(cap) -> str:
    lines = [f"  {t.qps:10.4f} req/s: {'meets the SLOs' if t.met else 'fails: ' + t.why}" for t in cap.trials]
    head = (f"capacity: {cap.qps:.4f} req/s within the SLOs" if cap.qps is not None else
            "capacity: no rate tried meets the SLOs")
    tail = [f"first failing rate: {cap.failed_qps:.4f} req/s" if cap.failed_qps is not None else
            "no failing rate found within the runs"]
    best = [_text(cap.best)] if cap.best is not None else []
    return "\n".join([head, *lines, *tail, *best])


def _text(result) -> str:
    m = result.metrics
    lines = [f"{m['completed']} requests served ({m['refused']} refused; warm-up {m['warmup_requests']} and drain "
             f"{m['drain_requests']} left out) in {m['duration_s']:.3f} s: {m['label']}",
             f"scheduler {result.engine.scheduler}, {result.replicas} replica(s) of {result.engine.kv_blocks} KV blocks, "
             f"router {result.router}, step model {result.step_model['kind']}"]
    for key in ("request_throughput", "request_goodput", "output_throughput", "total_token_throughput"):
        if m[key] is not None:
            lines.append(f"{key.replace('_', ' ')}: {m[key]:.3f} /s")
    for k in ("ttft", "tpot", "itl", "e2el"):
        if m[f"mean_{k}_ms"] is not None:
            lines.append(f"{k.upper():5} ms  mean {m[f'mean_{k}_ms']:.3f}  p50 {m[f'p50_{k}_ms']:.3f}  "
                         f"p90 {m[f'p90_{k}_ms']:.3f}  p99 {m[f'p99_{k}_ms']:.3f}")
    if result.extra.get("step_model_error", {}).get("held_out_shapes"):
        e = result.extra["step_model_error"]
        lines.append(f"step model tables vs direct simulation, {e['held_out_shapes']} held-out shapes: median "
                     f"{100 * e['median_rel_error']:.1f}%, p95 {100 * e['p95_rel_error']:.1f}%")
    if "disaggregation" in result.extra:
        d = result.extra["disaggregation"]
        lines.append(f"disaggregated: {d['prefill_replicas']} prefill + {d['decode_replicas']} decode replicas, "
                     f"{d['kv_transfers']} KV transfers over {d['links']} link(s), mean {1e3 * d['mean_kv_transfer_s']:.3f} "
                     f"ms each, {1e3 * d['mean_kv_wait_s']:.3f} ms from first token to KV arrival")
    return "\n".join(lines)
