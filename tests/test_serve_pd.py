"""kbtorch.serve: prefill/decode disaggregation (prefill and decode pools, the KV moving
between them over queued links) and the simulated KV transfer."""
from pathlib import Path

import numpy as np
import pytest

import kbtorch
import kbtorch.serve as serve
from kbtorch.serve import SchedulerConfig

SYSTEM = str(Path(__file__).parent / "data" / "tiny_system.toml")


def _pd_case(seed: int):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(20, 80))
    wl = serve.synthetic(n, qps=float(rng.uniform(20, 400)), input_tokens={"kind": "uniform", "low": 1, "high": 300},
                         output_tokens={"kind": "zipf", "low": 1, "high": 60, "a": 1.1}, seed=seed)
    replicas = int(rng.integers(2, 5))
    pd = serve.Disaggregation(int(rng.integers(1, replicas)), serve.LinkTransfer(float(rng.uniform(0.5, 50)), 1e3),
                              kv_bytes_per_token=int(rng.integers(100, 100_000)), links=int(rng.integers(1, 3)))
    limits = SchedulerConfig(max_num_batched_tokens=int(rng.integers(64, 512)), max_num_seqs=int(rng.integers(1, 16)))
    return wl, pd, replicas, limits, int(rng.integers(30, 120))


@pytest.mark.parametrize("seed", range(12))
def test_pd_invariants(seed):
    """Every request ends once: finished with all its tokens (the first from a prefill replica,
    the rest from a decode replica after its KV arrived) or refused with a reason; prefill
    replicas run prompts only; a link carries one transfer at a time."""
    wl, pd, replicas, limits, blocks = _pd_case(seed)
    r = serve.run(wl, serve.ConstantStep(1e6), kv_blocks=blocks, limits=limits, replicas=replicas,
                  router=list(serve.ROUTERS)[seed % 4], warmup=0.0, drain=0.0, disaggregation=pd)
    assert [x.id for x in r.requests] == [x.id for x in wl.requests]
    for x in r.requests:
        if x.status == "refused":
            assert x.reason and not x.token_s
            continue
        assert len(x.token_s) == x.output_tokens and list(x.token_s) == sorted(x.token_s)
        if x.output_tokens > 1:
            assert x.prefill_replica < pd.prefill <= x.replica
            start, end = x.kv_transfer_s
            assert x.token_s[0] <= start <= end < x.token_s[1]
        else:
            assert x.replica < pd.prefill and not x.kv_transfer_s
    for s in r.steps:
        if s.replica < pd.prefill:
            assert s.prefill_seqs == s.seqs
    for link in range(pd.links):
        spans = sorted((a, b) for li, a, b, _ in r.transfers if li == link)
        assert all(b0 <= a1 for (_, b0), (a1, _) in zip(spans, spans[1:]))
    assert r.extra["disaggregation"]["kv_transfers"] == sum(1 for x in r.requests if x.kv_transfer_s)


def test_pd_times_one_request_exactly():
    """1 ms steps, 100 prompt tokens x 1000 B at 1 GB/s plus 1 us: the first token at 1 ms,
    the KV there 101 us later, then a token per step."""
    wl = serve.synthetic(1, qps=1.0, input_tokens=100, output_tokens=4)
    pd = serve.Disaggregation(1, serve.LinkTransfer(1.0, 1e3), kv_bytes_per_token=1000)
    r = serve.run(wl, serve.ConstantStep(1e6), kv_blocks=64, replicas=2, warmup=0.0, drain=0.0, disaggregation=pd)
    x = r.requests[0]
    assert x.token_s == pytest.approx((1e-3, 2.101e-3, 3.101e-3, 4.101e-3), abs=1e-12)
    assert x.kv_transfer_s == pytest.approx((1e-3, 1.101e-3)) and (x.prefill_replica, x.replica) == (0, 1)
    decode = [s for s in r.steps if s.replica == 1]
    assert [s.new_tokens for s in decode] == [1, 1, 1] and all(s.prefill_seqs == 0 for s in decode)


def test_pd_link_queues_transfers():
    """Two prompts done at once on two prefill replicas: one link takes them one after the other."""
    wl = serve.synthetic(2, qps=1e9, input_tokens=100, output_tokens=2, arrival="constant")
    pd = serve.Disaggregation(2, serve.LinkTransfer(1.0), kv_bytes_per_token=1000)
    r = serve.run(wl, serve.ConstantStep(1e6), kv_blocks=64, replicas=3, warmup=0.0, drain=0.0, disaggregation=pd)
    spans = sorted(x.kv_transfer_s for x in r.requests)
    assert spans[0][1] == pytest.approx(spans[1][0]) and spans[1][1] - spans[1][0] == pytest.approx(1e-4)


@pytest.mark.parametrize("args, message", [
    ((0, serve.LinkTransfer(1.0), 10), "prefill must be a positive integer"),
    ((1, serve.LinkTransfer(1.0), 10, 0), "links must be a positive integer"),
    ((1, serve.LinkTransfer(1.0), 0), "kv_bytes_per_token must be a positive integer"),
])
def test_pd_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        serve.Disaggregation(*args)


def test_pd_needs_a_decode_replica():
    pd = serve.Disaggregation(2, serve.LinkTransfer(1.0), 10)
    with pytest.raises(ValueError, match="leaves no decode replica"):
        serve.run(serve.synthetic(2, 1.0, 8, 8), serve.ConstantStep(1e6), kv_blocks=8, replicas=2, disaggregation=pd)
    with pytest.raises(ValueError, match="gbps must be a finite number > 0"):
        serve.LinkTransfer(0.0)


def test_simulated_kv_transfer_grows_with_bytes_and_distance():
    """The simulator times a KV move: more bytes take longer; chips of one tray are nearer than
    chips of two trays (a switch between them); a bad chip list is named."""
    with kbtorch.use(SYSTEM):
        small, big = kbtorch.chip_transfer_ns((0,), (1,), 1 << 12), kbtorch.chip_transfer_ns((0,), (1,), 1 << 18)
        far = kbtorch.chip_transfer_ns((0,), (2,), 1 << 18)
        assert 0 < small < big < far
        with pytest.raises(ValueError, match="two disjoint lists"):
            kbtorch.chip_transfer_ns((0,), (0,), 1 << 12)
        with pytest.raises(ValueError, match="chip 9 is outside topology"):
            kbtorch.chip_transfer_ns((0,), (9,), 1 << 12)


def test_pd_on_the_command_line(capsys):
    from kbtorch.cli import main
    import json
    assert main(["serve", "--requests", "40", "--qps", "20", "--kv-blocks", "256", "--replicas", "3", "--pd-prefill", "1",
                 "--kv-link-gbps", "10", "--kv-bytes-per-token", "4096", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["disaggregation"]["prefill_replicas"] == 1 and out["disaggregation"]["kv_transfers"] == 40


@pytest.mark.parametrize("argv, message", [
    (["--replicas", "2", "--pd-prefill", "2", "--kv-link-gbps", "1", "--kv-bytes-per-token", "8"], "leave no decode"),
    (["--replicas", "2", "--pd-prefill", "1", "--kv-bytes-per-token", "8"], "--kv-link-gbps"),
    (["--replicas", "2", "--pd-prefill", "1", "--kv-link-gbps", "1"], "--kv-bytes-per-token"),
    (["--kv-link-gbps", "1"], "needs --pd-prefill"),
])
def test_pd_command_line_errors(capsys, argv, message):
    from kbtorch.cli import main
    assert main(["serve", "--requests", "4", "--qps", "1", "--kv-blocks", "64", *argv]) != 0
    assert message in capsys.readouterr().err


def test_pd_with_the_simulated_step_and_link():
    """Tiny Qwen2 on the tiny system, 2 replicas of TP 2: replica 0 prefills, replica 1 decodes,
    the KV timed by the simulator from chips 0-1 to chips 2-3, longer for longer prompts."""
    pytest.importorskip("transformers")
    step = serve.SimulatedStep("tiny-qwen2", SYSTEM, tp=2, dp=2, held_out=())
    link = step.kv_link()
    assert 0 < link.transfer_ns(1 << 10) < link.transfer_ns(1 << 16)
    assert link.describe()["from_chips"] == [0, 1] and link.describe()["to_chips"] == [2, 3]
    pd = serve.Disaggregation(1, link, step.kv_bytes_per_token())
    wl = serve.synthetic(6, 100.0, {"kind": "uniform", "low": 8, "high": 64}, 4, seed=1)
    r = serve.run(wl, step, kv_blocks=128, replicas=2, warmup=0.0, drain=0.0, disaggregation=pd)
    assert r.metrics["completed"] == 6 and all(x.kv_transfer_s for x in r.requests)
    with pytest.raises(ValueError, match="give dp >= 2"):
        serve.SimulatedStep("tiny-qwen2", SYSTEM, tp=4, dp=1, held_out=()).transfer_ns(1024)
