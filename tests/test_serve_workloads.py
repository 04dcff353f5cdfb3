"""kbtorch.serve workloads: arrivals, lengths, the shipped Azure traces, Mooncake and plain
traces, rescaling, closed loops, and bad trace files named by file, line and column."""
import json

import numpy as np
import pytest

import kbtorch.serve as serve


def test_arrivals_are_seeded_and_start_at_zero():
    for kind in ("poisson", "gamma", "constant"):
        a, b = serve.arrivals(kind, 500, 10.0, seed=3), serve.arrivals(kind, 500, 10.0, seed=3)
        assert a[0] == 0.0 and np.array_equal(a, b) and np.all(np.diff(a) >= 0)
    assert not np.array_equal(serve.arrivals("poisson", 50, 1.0, 1), serve.arrivals("poisson", 50, 1.0, 2))
    assert np.allclose(np.diff(serve.arrivals("constant", 5, 4.0)), 0.25)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_arrivals_as_vllm(burstiness):
    """Gaps of shape = burstiness, scale = 1 / (qps * burstiness): mean 1 / qps, CV^2 = 1 / burstiness."""
    gaps = np.diff(serve.arrivals("gamma", 200_001, 8.0, seed=0, burstiness=burstiness))
    assert gaps.mean() == pytest.approx(1 / 8.0, rel=0.02)
    assert gaps.var() / gaps.mean() ** 2 == pytest.approx(1 / burstiness, rel=0.05)


def test_lengths():
    assert list(serve.lengths("fixed", 3, value=7)) == [7, 7, 7]
    u = serve.lengths("uniform", 10_000, seed=1, low=5, high=9)
    assert u.min() == 5 and u.max() == 9
    z = serve.lengths("zipf", 10_000, seed=1, low=10, high=1000, a=1.2)
    assert z.min() >= 10 and z.max() <= 1000 and np.median(z) < 100 and (z == 10).mean() > 0.1


@pytest.mark.parametrize("call,message", [
    (lambda: serve.arrivals("weibull", 3, 1.0), "unknown kind 'weibull'"),
    (lambda: serve.arrivals("poisson", 3, 0.0), "qps > 0"),
    (lambda: serve.arrivals("gamma", 3, 1.0, burstiness=0), "burstiness"),
    (lambda: serve.lengths("uniform", 3, low=5, high=2), "low <= high"),
    (lambda: serve.lengths("fixed", 3, value=0), "positive"),
    (lambda: serve.synthetic(3, 1.0, 4, 4, concurrency=0), "concurrency")])
def test_synthetic_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("name,count", [("azure-conv", 19366), ("azure-code", 8819)])
def test_shipped_azure_traces(name, count):
    wl = serve.azure(name)
    reqs = wl.requests
    assert len(reqs) == count and reqs[0].arrival_s == 0.0
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:]))
    assert 3000 < reqs[-1].arrival_s < 4000                       # about an hour of each
    assert min(r.input_tokens for r in reqs) >= 1 and min(r.output_tokens for r in reqs) >= 1
    assert serve.trace(name).requests == reqs


def test_azure_trace_serves_and_rescales():
    wl = serve.rescale(serve.azure("azure-code"), qps=2.0, limit=200)
    assert len(wl.requests) == 200 and (len(wl.requests) - 1) / wl.requests[-1].arrival_s == pytest.approx(2.0)
    assert serve.rescale(wl, time_scale=0.5).requests[-1].arrival_s == pytest.approx(wl.requests[-1].arrival_s / 2)
    r = serve.run(wl, serve.ConstantStep(5e6), kv_blocks=2048, slos={"ttft": "2s", "tpot": "200ms"})
    assert r.metrics["completed"] == 160 and r.metrics["request_goodput"] is not None


def test_mooncake_and_plain_traces(tmp_path):
    moon = tmp_path / "m.jsonl"
    moon.write_text("\n".join(json.dumps(d) for d in (
        {"timestamp": 1000, "input_length": 1024, "output_length": 4, "hash_ids": [1, 2]},
        {"timestamp": 1500, "input_length": 600, "output_length": 2, "hash_ids": [1, 3]})) + "\n")
    wl = serve.trace(str(moon))
    assert [r.arrival_s for r in wl.requests] == [0.0, 0.5] and wl.requests[1].hash_ids == (1, 3)
    r = serve.run(wl, serve.ConstantStep(1e6), kv_blocks=128, warmup=0, drain=0)
    assert r.requests[1].cached_tokens == 512                      # the shared first hash block
    csv_path, jsonl = tmp_path / "p.csv", tmp_path / "p.jsonl"
    csv_path.write_text("arrival_s,input_tokens,output_tokens\n0.5,10,3\n1.5,20,4\n")
    jsonl.write_text('{"arrival_s": 0.5, "input_tokens": 10, "output_tokens": 3}\n'
                     '{"arrival_s": 1.5, "input_tokens": 20, "output_tokens": 4}\n')
    a, b = serve.trace(str(csv_path)), serve.trace(str(jsonl))
    assert a.requests == b.requests and a.requests[1] == serve.Request(1, 1.0, 20, 4)


AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.mark.parametrize("suffix,text,message", [
    (".csv", "TIMESTAMP,Context,GeneratedTokens\n2023-11-16 18:15:46.68,1,1\n", r"t\.csv:1: column 'ContextTokens': missing"),
    (".csv", AZURE + "2023-11-16 18:15:46.68,10,-3\n", r"t\.csv:2: column 'GeneratedTokens': must be >= 1, got -3"),
    (".csv", AZURE + "2023-11-16 18:15:46.68,ten,3\n", r"t\.csv:2: column 'ContextTokens': expected an integer"),
    (".csv", AZURE + "2023-11-16 18:15:47.00,10,3\n2023-11-16 18:15:46.00,10,3\n",
     r"t\.csv:3: column 'TIMESTAMP': times must not decrease"),
    (".csv", AZURE + "16/11/2023,10,3\n", r"t\.csv:2: column 'TIMESTAMP': expected 'YYYY-MM-DD"),
    (".csv", AZURE + "2023-11-16 18:15:46.68,10\n", r"t\.csv:2: column 'GeneratedTokens': expected 3 fields"),
    (".csv", AZURE, r"t\.csv:1: column 'TIMESTAMP': the trace has no requests"),
])
def test_bad_azure_trace(tmp_path, suffix, text, message):
    path = tmp_path / f"t{suffix}"
    path.write_text(text)
    with pytest.raises(serve.TraceError, match=message):
        serve.trace(str(path), "azure")


@pytest.mark.parametrize("kind,suffix,text,message", [
    ("mooncake", ".jsonl", '{"timestamp": 0, "input_length": 5}\n', r"t\.jsonl:1: column 'output_length': missing field"),
    ("mooncake", ".jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{oops\n', r"t\.jsonl:2: column '-': not JSON"),
    ("mooncake", ".jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "a"}\n',
     r"t\.jsonl:1: column 'hash_ids': expected a list"),
    ("mooncake", ".jsonl", '{"timestamp": 0, "input_length": 5.5, "output_length": 1}\n',
     r"t\.jsonl:1: column 'input_length': expected an integer"),
    ("plain", ".csv", "arrival_s,input_tokens,output_tokens,extra\n0,1,1,2\n", r"t\.csv:1: column 'extra': unexpected"),
    ("plain", ".csv", "arrival_s,input_tokens,output_tokens\n-1,1,1\n", r"t\.csv:2: column 'arrival_s': must be a finite"),
    ("plain", ".csv", "arrival_s,input_tokens,output_tokens\n0,0,1\n", r"t\.csv:2: column 'input_tokens': must be >= 1"),
    ("plain", ".jsonl", '{"arrival_s": 2, "input_tokens": 1, "output_tokens": 1}\n'
                        '{"arrival_s": 1, "input_tokens": 1, "output_tokens": 1}\n',
     r"t\.jsonl:2: column 'arrival_s': times must not decrease: 1\.0 after 2\.0 on line 1"),
])
def test_bad_jsonl_and_plain_traces(tmp_path, kind, suffix, text, message):
    path = tmp_path / f"t{suffix}"
    path.write_text(text)
    with pytest.raises(serve.TraceError, match=message):
        serve.trace(str(path), kind)


def test_unreadable_trace_is_named():
    with pytest.raises(ValueError, match="trace '/no/such.csv': cannot read it"):
        serve.trace("/no/such.csv")


def test_closed_loop_keeps_concurrency_outstanding():
    wl = serve.synthetic(200, qps=1.0, input_tokens=32, output_tokens=8, concurrency=4, seed=2)
    r = serve.run(wl, serve.ConstantStep(1e6), kv_blocks=512, warmup=0, drain=0)
    assert all(s.waiting + s.running <= 4 for s in r.steps) and max(s.running for s in r.steps) == 4
    assert r.metrics["completed"] == 200 and r.requests[-1].arrival_s > 0
