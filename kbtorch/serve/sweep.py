"""Serving as a sweep workload: ``fn = "kbtorch.serve.sweep:point"`` in a study file, swept over
machines (``topology`` axes and hardware overrides) and any of ``point``'s params (the rate, the
plan, the scheduler, the P/D split) by ``kbtorch sweep``, on Dask like every sweep.

Each point serves a trace on the simulated step model of its machine; the step times it
simulates go into the sweep's store (``serve.cache``, table ``serve_steps``), so every later
point on the same machine, model and plan (in any worker, and any later run of the sweep)
reads them instead of simulating them again. ``kbtorch/studies/serve_llama70b.toml`` is the
shipped study; ``docs/serving_study.md`` its results. ``server`` builds one plan's step model
and its runs at any rate, for a script of its own (``examples/serve_capacity.py``).
"""
from __future__ import annotations

from . import find_capacity, rescale, run, trace as read_trace
from .loop import Disaggregation
from .scheduler import SchedulerConfig

#: The figures of a point's run copied into its row (``metrics.compute``'s names).
FIGURES = ("completed", "refused", "label", "request_throughput", "request_goodput", "output_throughput",
           "mean_ttft_ms", "p99_ttft_ms", "mlperf_p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mlperf_p99_tpot_ms",
           "mean_e2el_ms", "p99_e2el_ms", "preemptions", "duration_s")


def point(machine, store: str | None = None, model: str = "qwen2.5-7b", trace: str = "azure-conv",
          requests: int = 1000, qps: float = 1.0, tp: int = 0, replicas: int = 1, pd_prefill: int = 0,
          kv_links: int = 1, scheduler: str = "vllm", max_num_batched_tokens: int = 8192, max_num_seqs: int = 256,
          chunk_tokens: int = 512, router: str = "round-robin", hbm_utilization: float = 0.9,
          host_overhead_ns: float = 0.0, ttft: str = "2s", tpot: str = "200ms", capacity: bool = False,
          tolerance: float = 0.05) -> dict:
    """Serve the first ``requests`` of ``trace`` (a shipped name or a file) at ``qps`` on
    ``replicas`` replicas of ``model`` over ``machine``'s chips (``tp`` chips each; 0: all
    chips over the replicas), the first ``pd_prefill`` of them prefilling (0: no split) ->
    the run's figures, per chip too; ``capacity``: the highest rate within the SLOs instead
    (searched from ``qps``). ``latency_ns``: the mean E2E latency (of the best run when
    searching)."""
    slos = {"ttft": ttft, "tpot": tpot}
    limits = SchedulerConfig(max_num_batched_tokens, max_num_seqs, chunk_tokens)
    step, blocks, serve_at = server(machine, store, model, trace, requests, tp, replicas, pd_prefill, kv_links,
                                    scheduler, limits, router, hbm_utilization, host_overhead_ns, slos)
    chips = machine.chips
    row = {"chips": chips, "kv_blocks": blocks, "plan": step.plan}
    if capacity:
        cap = find_capacity(serve_at, slos, qps, tolerance)
        result = cap.best
        row.update(capacity_qps=cap.qps, capacity_qps_per_chip=cap.qps / chips if cap.qps is not None else None,
                   first_failing_qps=cap.failed_qps, trials=len(cap.trials))
    else:
        result = serve_at(qps)
    m = result.metrics if result is not None else {}
    row.update({k: m.get(k) for k in FIGURES})
    good = m.get("request_goodput")
    row["goodput_per_chip"] = good / chips if good is not None else None
    row["latency_ns"] = m["mean_e2el_ms"] * 1e6 if m.get("mean_e2el_ms") is not None else None
    row.update(simulated_shapes=step.simulated, cached_shapes=step.cached)
    return row


def server(machine, store: str | None, model: str, trace: str, requests: int, tp: int = 0, replicas: int = 1,
           pd_prefill: int = 0, kv_links: int = 1, scheduler: str = "vllm", limits: SchedulerConfig | None = None,
           router: str = "round-robin", hbm_utilization: float = 0.9, host_overhead_ns: float = 0.0,
           slos: dict | None = None) -> tuple:
    """(the simulated step model, KV blocks per replica, ``serve_at(rate)``: the run of the
    first ``requests`` of ``trace`` rescaled to ``rate``) of a plan (``point``'s params), for
    a run or a capacity search (``find_capacity(serve_at, slos, ...)``)."""
    from .simulated import SimulatedStep
    step = SimulatedStep(model, machine, tp or None, replicas, held_out=(), cache=store)
    blocks = step.kv_blocks(hbm_utilization)
    pd = Disaggregation(pd_prefill, step.kv_link(), step.kv_bytes_per_token(), kv_links) if pd_prefill else None
    source = read_trace(trace)

    def serve_at(rate: float):
        return run(rescale(source, qps=rate, limit=requests), step, blocks, scheduler, limits, replicas, router,
                   host_overhead_ns, slos=slos, disaggregation=pd)
    return step, blocks, serve_at
