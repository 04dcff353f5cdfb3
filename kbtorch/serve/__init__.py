"""Serving on simulated hardware: request workloads through batch schedulers, a paged KV cache,
replicas behind a router, each iteration timed by a step model (docs/model.md "Serving").

    import kbtorch.serve as serve
    wl = serve.synthetic(1000, qps=4.0, input_tokens={"kind": "uniform", "low": 64, "high": 1024},
                         output_tokens=128, seed=0)
    result = serve.run(wl, serve.ConstantStep(step_ns=20e6), kv_blocks=4096, slos={"ttft": "2s", "tpot": "200ms"})
    result.metrics["p99_ttft_ms"], result.metrics["label"]
    cap = serve.find_capacity(lambda qps: serve.run(serve.synthetic(1000, qps, 512, 128, seed=0),
                                                    serve.ConstantStep(step_ns=20e6), kv_blocks=4096,
                                                    slos={"ttft": "2s"}), {"ttft": "2s"})
    cap.qps                                    # the highest rate within the SLOs

Layer: above the public API and ``kbtorch.models`` (tests/test_imports.py); it uses nothing else of kbtorch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from .capacity import Capacity, Trial, search as find_capacity, verdict
from .kv import BLOCK_TOKENS, KVCache, block_key, capacity_blocks
from .loop import ROUTERS, Disaggregation, EngineConfig, RequestRecord, StepRecord, simulate
from .metrics import compute, mlperf_p99, parse_slo, split, write_csv
from . import plots
from .plots import plot_latency_qps, plot_timeline
from .scheduler import SCHEDULERS, BatchEntry, Scheduler, SchedulerConfig
from .steps import ConstantStep, LinkTransfer, TableStep
from .workloads import Request, TraceError, Workload, arrivals, azure, lengths, mooncake, plain, rescale, synthetic, trace


@dataclass(frozen=True)
class ServeResult:
    """A run: every figure (``metrics``), what happened to each request and each step, and how
    it was set up (``engine``, ``replicas``, ``router``, ``step_model``: its description)."""

    metrics: dict
    requests: tuple
    steps: tuple
    engine: EngineConfig
    replicas: int
    router: str
    step_model: dict
    warmup: float = 0.1
    drain: float = 0.1
    extra: dict = field(default_factory=dict)
    transfers: tuple = ()

    def timeline(self) -> list:
        """(start_s, replica, KV share held, waiting requests) of every step."""
        cap = self.engine.kv_blocks
        return [(s.start_s, s.replica, s.kv_used_blocks / cap, s.waiting) for s in self.steps]

    def to_json(self) -> dict:
        """One JSON object: the figures, the setup and the peaks of the timeline."""
        line = self.timeline()
        return {"metrics": self.metrics, "step_model": self.step_model, "replicas": self.replicas, "router": self.router,
                "scheduler": self.engine.scheduler, "kv_blocks": self.engine.kv_blocks,
                "block_tokens": self.engine.block_tokens, "host_overhead_ns": self.engine.host_overhead_ns,
                "max_num_batched_tokens": self.engine.limits.max_num_batched_tokens,
                "max_num_seqs": self.engine.limits.max_num_seqs, "requests": len(self.requests), "steps": len(self.steps),
                "peak_kv_share": max((x[2] for x in line), default=0.0),
                "peak_waiting": max((x[3] for x in line), default=0), **self.extra}

    def write_csv(self, path: str) -> None:
        write_csv(path, self.requests, self.warmup, self.drain)

    def export_chrome_trace(self, path: str) -> None:
        """Chrome/Perfetto JSON of the run (times in us): on each replica's track its steps
        (batch size, new tokens, prefills, KV blocks, waiting), counters of its KV share and
        queue length, and on one track a request's span from arrival to its last token."""
        cap = self.engine.kv_blocks
        events = []
        for s in self.steps:
            base = {"pid": 1, "tid": s.replica + 2, "ts": s.start_s * 1e6}
            events.append(dict(base, ph="X", dur=(s.end_s - s.start_s) * 1e6, name=f"step: {s.seqs} seqs", cat="step",
                               args={"seqs": s.seqs, "new_tokens": s.new_tokens, "prefill_seqs": s.prefill_seqs,
                                     "kv_used_blocks": s.kv_used_blocks, "waiting": s.waiting, "running": s.running}))
            events.append(dict(base, ph="C", name=f"replica {s.replica}",
                               args={"kv_share": s.kv_used_blocks / cap, "waiting": s.waiting}))
        for r in self.requests:
            end = r.token_s[-1] if r.token_s else r.arrival_s
            events.append({"pid": 1, "tid": 1, "ph": "X", "ts": r.arrival_s * 1e6, "dur": (end - r.arrival_s) * 1e6,
                           "name": f"request {r.id}", "cat": r.status,
                           "args": {"replica": r.replica, "input_tokens": r.input_tokens, "output_tokens": r.output_tokens,
                                    "status": r.status, "reason": r.reason, "preemptions": r.preemptions}})
        names = {1: "requests"} | {s.replica + 2: f"replica {s.replica}" for s in self.steps}
        events += [{"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": n}}
                   for tid, n in sorted(names.items())]
        with open(path, "w") as fh:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, fh)


def run(workload: Workload, step_model, kv_blocks: int, scheduler: str = "vllm",
        limits: SchedulerConfig | None = None, replicas: int = 1, router: str = "round-robin",
        host_overhead_ns: float = 0.0, block_tokens: int = BLOCK_TOKENS, prefix_caching: bool = True,
        slos: dict | None = None, warmup: float = 0.1, drain: float = 0.1,
        disaggregation: Disaggregation | None = None) -> ServeResult:
    """Serve ``workload`` on ``replicas`` engines of ``kv_blocks`` blocks each, every step timed
    by ``step_model`` plus ``host_overhead_ns`` -> the frozen result; with ``disaggregation``
    the first replicas prefill and the others decode, the KV moving between them. The SLOs and
    the shares are checked before the run."""
    for k, v in (slos or {}).items():
        parse_slo(k, v)
    split((), warmup, drain)
    engine = EngineConfig(kv_blocks, scheduler, limits or SchedulerConfig(), block_tokens, prefix_caching,
                          host_overhead_ns)
    records, steps, transfers = simulate(workload, step_model, engine, replicas, router, disaggregation)
    metrics = compute(records, slos, warmup, drain)
    extra = {"step_model_error": step_model.error()} if hasattr(step_model, "error") else {}
    if disaggregation:
        pd = disaggregation
        extra["disaggregation"] = {
            "prefill_replicas": pd.prefill, "decode_replicas": replicas - pd.prefill, "links": pd.links,
            "transfer": pd.transfer.describe(), "kv_transfers": len(transfers),
            "kv_bytes": sum(t[3] for t in transfers),
            "mean_kv_transfer_s": sum(t[2] - t[1] for t in transfers) / len(transfers) if transfers else 0.0,
            "mean_kv_wait_s": (sum(r.kv_transfer_s[1] - r.token_s[0] for r in records if r.kv_transfer_s)
                               / len(transfers) if transfers else 0.0)}
    return ServeResult(metrics, records, steps, engine, replicas, router, step_model.describe(), warmup, drain, extra,
                       transfers)


def __getattr__(name):
    # NOTE: the simulated step model imports transformers: only when asked for.
    if name == "SimulatedStep":
        from .simulated import SimulatedStep
        return SimulatedStep
    raise AttributeError(f"module kbtorch.serve has no attribute {name!r}")


__all__ = ["BLOCK_TOKENS", "BatchEntry", "Capacity", "ConstantStep", "Disaggregation", "EngineConfig", "KVCache", "LinkTransfer", "ROUTERS", "Request",
           "RequestRecord", "SCHEDULERS", "Scheduler", "SchedulerConfig", "ServeResult", "SimulatedStep",
           "StepRecord", "TableStep", "TraceError", "Trial", "Workload", "arrivals", "azure", "block_key",
           "capacity_blocks", "compute", "find_capacity", "lengths", "mlperf_p99", "mooncake", "parse_slo", "plain", "plot_latency_qps", "plot_timeline",
           "rescale", "run", "simulate", "synthetic", "trace", "verdict"]
