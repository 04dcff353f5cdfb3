"""kbtorch.serve: the loop's invariants over random seeds, M/D/1 queueing, vLLM's metrics."""
import math

import numpy as np
import pytest

import kbtorch.serve as serve
from kbtorch.serve import SchedulerConfig
from kbtorch.serve.scheduler import Scheduler


class Recording:
    """A step model that keeps every batch it timed (and times it by its tokens)."""

    def __init__(self):
        self.batches = []

    def step_ns_of(self, batch):
        self.batches.append(batch)
        return 1e6 + 2e3 * sum(e.new_tokens for e in batch) + 10 * sum(e.context_tokens for e in batch)

    def describe(self):
        return {"kind": "recording"}


def _random_case(seed: int):
    rng = np.random.default_rng(seed)
    policy = list(serve.SCHEDULERS)[seed % len(serve.SCHEDULERS)]
    n = int(rng.integers(30, 120))
    wl = serve.synthetic(n, qps=float(rng.uniform(5, 200)), input_tokens={"kind": "uniform", "low": 1, "high": 400},
                         output_tokens={"kind": "zipf", "low": 1, "high": 200, "a": 1.1}, seed=seed,
                         arrival=("poisson", "gamma", "constant")[seed % 3], burstiness=0.5,
                         concurrency=int(rng.integers(1, 16)) if seed % 5 == 0 else None)
    limits = SchedulerConfig(max_num_batched_tokens=int(rng.integers(64, 1024)), max_num_seqs=int(rng.integers(1, 32)),
                             chunk_tokens=int(rng.integers(16, 256)), long_prefill_tokens=int(rng.integers(0, 2)) * 64)
    return wl, policy, limits, int(rng.integers(8, 80)), int(rng.integers(1, 4))


@pytest.mark.parametrize("seed", range(24))
def test_invariants_hold_over_random_runs(seed, monkeypatch):
    """Budget, max_num_seqs and KV capacity never exceeded; the KV books agree after every
    step; every request ends exactly once, finished with all its tokens or refused with a reason."""
    wl, policy, limits, blocks, replicas = _random_case(seed)
    complete = Scheduler.complete

    def checked(self, batch, now_s):
        out = complete(self, batch, now_s)
        self.kv.check()
        return out
    monkeypatch.setattr(Scheduler, "complete", checked)
    model = Recording()
    result = serve.run(wl, model, kv_blocks=blocks, scheduler=policy, limits=limits, replicas=replicas,
                       router=list(serve.ROUTERS)[seed % 4], warmup=0.0, drain=0.0)
    budget = limits.chunk_tokens if policy == "sarathi" else limits.max_num_batched_tokens
    for step in result.steps:
        assert 0 < step.new_tokens <= budget and 0 < step.seqs <= limits.max_num_seqs
        assert step.kv_used_blocks <= blocks
    for batch in model.batches:
        assert len({e.rid for e in batch}) == len(batch)
    assert [r.id for r in result.requests] == [r.id for r in wl.requests]
    for r in result.requests:
        if r.status == "finished":
            assert len(r.token_s) == r.output_tokens and list(r.token_s) == sorted(r.token_s)
        else:
            assert r.status == "refused" and r.reason and not r.token_s
    assert sum(r.status == "finished" for r in result.requests) == result.metrics["completed"]


def test_md1_mean_wait_matches_theory():
    """Poisson arrivals, one request at a time, a deterministic service D: the mean wait of
    200,000 requests (warm-up and drain 10% each left out) within 2% of lambda D^2 / (2 (1 - rho)).
    NOTE: the estimate's own spread over seeds is about 1.1% (one sigma) at this size; the
    exact check of the loop is the Lindley recursion below."""
    step_s, rho = 0.01, 0.5
    lam = rho / step_s
    wl = serve.synthetic(200_000, qps=lam, input_tokens=1, output_tokens=1, seed=0)
    r = serve.run(wl, serve.ConstantStep(step_s * 1e9), kv_blocks=4, scheduler="static",
                  limits=SchedulerConfig(max_num_seqs=1))
    theory = lam * step_s ** 2 / (2 * (1 - rho))
    assert abs(r.metrics["mean_wait_s"] / theory - 1) < 0.02, (r.metrics["mean_wait_s"], theory)
    assert r.metrics["label"] == "stable"


@pytest.mark.parametrize("policy", list(serve.SCHEDULERS))
def test_single_server_waits_follow_lindley(policy):
    """One request at a time (max_num_seqs 1), one step each: every wait is Lindley's
    W(n+1) = max(0, W(n) + D - A(n+1)), exactly, whatever the policy."""
    step_s = 0.01
    wl = serve.synthetic(3000, qps=80.0, input_tokens=4, output_tokens=1, seed=5, arrival="gamma", burstiness=0.5)
    r = serve.run(wl, serve.ConstantStep(step_s * 1e9), kv_blocks=4, scheduler=policy,
                  limits=SchedulerConfig(max_num_seqs=1), warmup=0, drain=0)
    wait, got = 0.0, []
    for prev, req in zip((None, *wl.requests), wl.requests):
        if prev is not None:
            wait = max(0.0, wait + step_s - (req.arrival_s - prev.arrival_s))
        got.append(wait)
    assert [x.first_scheduled_s - x.arrival_s for x in r.requests] == pytest.approx(got, abs=1e-9)


def test_host_overhead_adds_to_every_step():
    wl = serve.synthetic(3, qps=0.001, input_tokens=16, output_tokens=4, seed=0)
    r = serve.run(wl, serve.ConstantStep(1e6), kv_blocks=16, host_overhead_ns=5e5, warmup=0, drain=0)
    assert r.metrics["mean_ttft_ms"] == pytest.approx(1.5) and r.metrics["mean_tpot_ms"] == pytest.approx(1.5)


def _record(arrival, tokens, rid=0):
    return serve.RequestRecord(rid, 0, arrival, 10, len(tokens), "finished", "", arrival, tuple(tokens))


def test_metrics_as_vllm_defines_them():
    """TTFT, TPOT = (E2E - TTFT) / (out - 1), pooled ITL, throughput over the duration,
    goodput, linear percentiles and MLPerf's floor-index P99."""
    recs = (_record(0.0, [0.1, 0.2, 0.4]), _record(1.0, [1.5]), _record(2.0, [2.2, 2.3], rid=2))
    m = serve.compute(recs, {"ttft": "150ms", "tpot": "0.2s"}, warmup=0, drain=0)
    assert m["mean_ttft_ms"] == pytest.approx((100 + 500 + 200) / 3)
    assert m["mean_tpot_ms"] == pytest.approx((150 + 100) / 2)        # one-token requests have no TPOT
    assert m["mean_itl_ms"] == pytest.approx((100 + 200 + 100) / 3)
    assert m["duration_s"] == pytest.approx(2.3)
    assert m["request_throughput"] == pytest.approx(3 / 2.3) and m["output_throughput"] == pytest.approx(6 / 2.3)
    assert m["total_token_throughput"] == pytest.approx(36 / 2.3)
    assert m["request_goodput"] == pytest.approx(1 / 2.3)            # only the first meets ttft 150 ms
    assert m["p90_ttft_ms"] == pytest.approx(np.percentile([100, 500, 200], 90))
    assert serve.mlperf_p99(list(range(100))) == 99 and serve.mlperf_p99(list(range(1000))) == 990
    assert serve.mlperf_p99(list(range(10))) == 9


@pytest.mark.parametrize("name,value,message", [
    ("ttft", "2000", "needs a unit"), ("tpot", 200, "needs a unit"), ("ttfb", "2s", "unknown"),
    ("e2el", "-1s", "needs a unit")])
def test_slos_need_units(name, value, message):
    with pytest.raises(ValueError, match=message):
        serve.run(serve.synthetic(2, 1.0, 1, 1), serve.ConstantStep(1.0), kv_blocks=1, slos={name: value})


def test_run_labels_overload():
    wl = serve.synthetic(400, qps=200.0, input_tokens=1, output_tokens=1, seed=1)
    r = serve.run(wl, serve.ConstantStep(1e7), kv_blocks=4, scheduler="static", limits=SchedulerConfig(max_num_seqs=1))
    assert r.metrics["label"] == "overloaded"


def test_preemption_by_recompute_newest_first():
    """Two long decodes on a cache too small for both: the newer one is preempted, recomputed, and finishes."""
    wl = serve.Workload((serve.Request(0, 0.0, 16, 40), serve.Request(1, 0.0, 16, 40)))
    r = serve.run(wl, serve.ConstantStep(1e6), kv_blocks=5, warmup=0, drain=0)
    assert [x.status for x in r.requests] == ["finished", "finished"]
    assert r.requests[0].preemptions == 0 and r.requests[1].preemptions >= 1


def test_refused_with_a_reason():
    wl = serve.Workload((serve.Request(0, 0.0, 1000, 10), serve.Request(1, 0.0, 10, 10)))
    r = serve.run(wl, serve.ConstantStep(1e6), kv_blocks=8, warmup=0, drain=0)
    assert r.requests[0].status == "refused" and "need 64 KV blocks; the replica holds 8" in r.requests[0].reason
    r = serve.run(wl, serve.ConstantStep(1e6), kv_blocks=100, scheduler="orca",
                  limits=SchedulerConfig(max_num_batched_tokens=512), warmup=0, drain=0)
    assert "does not chunk" in r.requests[0].reason and r.requests[1].status == "finished"


def test_prefix_caching_reuses_shared_blocks():
    """Mooncake-style hash ids: the second request with the same prefix finds its blocks."""
    a = serve.Request(0, 0.0, 1024, 2, (7, 8))
    b = serve.Request(1, 1.0, 1100, 2, (7, 8, 9))
    r = serve.run(serve.Workload((a, b)), serve.ConstantStep(1e6), kv_blocks=200, warmup=0, drain=0)
    assert r.requests[1].cached_tokens == 1024
    off = serve.run(serve.Workload((a, b)), serve.ConstantStep(1e6), kv_blocks=200, prefix_caching=False,
                    warmup=0, drain=0)
    assert off.requests[1].cached_tokens == 0


def test_kv_lru_evicts_least_recently_freed():
    kv = serve.KVCache(4, block_tokens=16)
    a, b, c = (serve.Request(i, 0.0, 32, 1, (i + 10,), 16) for i in range(3))
    for req in (a, b):
        assert kv.allocate(req, 32)
        kv.cache(req, 32)
    kv.free(a.id)
    kv.free(b.id)
    assert kv.allocate(c, 32)                                       # evicts a's blocks, freed first
    assert kv.cached_prefix(a, 33) == [] and len(kv.cached_prefix(b, 33)) == 2
    assert not kv.allocate(serve.Request(3, 0.0, 64, 1), 64) and kv.used == 2
    kv.check()


@pytest.mark.parametrize("args,message", [
    ((0, 0, 0, 100), "zero blocks"), ((10 ** 9, 2 * 10 ** 9, 0, 100), "zero blocks"),
    ((10 ** 9, 0, 0, 100, 16, 0), "override is 0")])
def test_kv_capacity_refuses_zero_blocks(args, message):
    with pytest.raises(ValueError, match=message):
        serve.capacity_blocks(*args)


def test_kv_capacity_from_bytes():
    assert serve.capacity_blocks(10 ** 6, 2 * 10 ** 5, 10 ** 5, 100) == math.floor(7 * 10 ** 5 / 1600)


def test_routers_spread_and_are_deterministic():
    wl = serve.synthetic(60, qps=50.0, input_tokens=64, output_tokens=8, seed=3)
    for router in serve.ROUTERS:
        a = serve.run(wl, serve.ConstantStep(1e6), kv_blocks=64, replicas=3, router=router)
        b = serve.run(wl, serve.ConstantStep(1e6), kv_blocks=64, replicas=3, router=router)
        assert a.requests == b.requests and len({r.replica for r in a.requests}) >= 2, router


def test_table_step_model_interpolates(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text("new_tokens,context_tokens,step_ns\n1,0,100\n101,0,300\n1,1000,200\n101,1000,400\n")
    table = serve.TableStep.read(str(path))
    assert table.lookup_ns(51, 0) == pytest.approx(200) and table.lookup_ns(51, 500) == pytest.approx(250)
    assert table.lookup_ns(201, 0) == pytest.approx(500)            # the end segment, extended
    wl = serve.synthetic(20, qps=10.0, input_tokens=32, output_tokens=4)
    assert serve.run(wl, table, kv_blocks=64).metrics["completed"] > 0


@pytest.mark.parametrize("text,message", [
    ("new_tokens,step_ns\n1,2\n", r"steps.csv:1: column 'context_tokens': missing column"),
    ("new_tokens,context_tokens,step_ns\n1,0,x\n", r"steps.csv:2: column 'step_ns': expected a number"),
    ("new_tokens,context_tokens,step_ns\n-1,0,5\n", r"steps.csv:2: column 'new_tokens': must be"),
    ("new_tokens,context_tokens,step_ns\n1,0,5\n1,0,6\n", r"steps.csv:3: column 'new_tokens': a second point")])
def test_table_step_model_bad_input(tmp_path, text, message):
    path = tmp_path / "steps.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        serve.TableStep.read(str(path))


def test_result_is_frozen_and_json():
    r = serve.run(serve.synthetic(10, 5.0, 8, 3), serve.ConstantStep(1e6), kv_blocks=16)
    with pytest.raises(AttributeError):
        r.replicas = 2
    out = r.to_json()
    assert out["metrics"]["completed"] == 8 and out["step_model"] == {"kind": "constant", "step_ns": 1e6}


def test_capacity_of_one_server_is_below_its_service_rate():
    """One request at a time, a deterministic step D (M/D/1): the mean wait rho D / (2 (1 - rho))
    passes the service time D at rho = 2/3, where a run turns ``backlogged``; the search finds
    that rate within its tolerance (and the sample's spread), every trial's verdict its own run's."""
    step_s = 0.01

    def serve_at(qps):
        return serve.run(serve.synthetic(2000, qps=qps, input_tokens=1, output_tokens=1, seed=0),
                         serve.ConstantStep(step_s * 1e9), kv_blocks=4, scheduler="static",
                         limits=SchedulerConfig(max_num_seqs=1), slos={"ttft": "1s"})
    cap = serve.find_capacity(serve_at, {"ttft": "1s"}, qps=10.0, tolerance=0.02)
    assert 0.62 / step_s < cap.qps < cap.failed_qps < 0.71 / step_s, (cap.qps, cap.failed_qps)
    assert cap.failed_qps / cap.qps - 1 <= 0.02 and cap.best.metrics["label"] == "stable"
    for t in cap.trials:
        assert t.met == serve.verdict(serve_at(t.qps).metrics, {"ttft": "1s"})[0] and (t.met or t.why)


def test_capacity_refuses_what_it_cannot_search():
    with pytest.raises(ValueError, match="at least one SLO"):
        serve.find_capacity(lambda q: None, {})
    with pytest.raises(ValueError, match="needs a unit"):
        serve.find_capacity(lambda q: None, {"ttft": "2"})
    with pytest.raises(ValueError, match="qps 0 must be > 0"):
        serve.find_capacity(lambda q: None, {"ttft": "2s"}, qps=0)
