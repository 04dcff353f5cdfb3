"""``kbtorch serve`` and the simulated step model (tiny model on the tiny test machine)."""
import csv
import json
from pathlib import Path

import pytest

import kbtorch.serve as serve
from kbtorch.cli import main

TINY = str(Path(__file__).parent / "data" / "tiny.toml")


def test_serve_json_is_one_object(capsys, tmp_path):
    out = tmp_path / "req.csv"
    argv = ["serve", "--trace", "azure-code", "--requests", "100", "--qps", "2", "--kv-blocks", "4096",
            "--slo", "ttft=2s", "--slo", "tpot=200ms", "--step-ns", "5e6", "--csv", str(out), "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["metrics"]["completed"] == 80 and data["metrics"]["slos_ms"] == {"ttft": 2000.0, "tpot": 200.0}
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 100 and {r["phase"] for r in rows} == {"warmup", "measured", "drain"}


def test_serve_text(capsys):
    assert main(["serve", "--requests", "40", "--qps", "5", "--kv-blocks", "512", "--scheduler", "sarathi"]) == 0
    text = capsys.readouterr().out
    assert "32 requests served" in text and "TTFT" in text and "scheduler sarathi" in text


@pytest.mark.parametrize("argv,message", [
    (["--qps", "1", "--kv-blocks", "8", "--slo", "ttft=2000"], "SLO 'ttft': '2000' needs a unit"),
    (["--qps", "1", "--kv-blocks", "8", "--slo", "ttft"], "is not NAME=VALUE"),
    (["--kv-blocks", "8"], "need --qps or --concurrency"),
    (["--qps", "1"], "argument --kv-blocks: needed with --step constant"),
    (["--qps", "1", "--kv-blocks", "8", "--scheduler", "fifo"], "unknown policy 'fifo'"),
    (["--qps", "1", "--kv-blocks", "8", "--input-tokens", "zipf:1"], "is not N, uniform:LO:HI"),
    (["--qps", "1", "--kv-blocks", "8", "--step", "table"], "--step table needs a CSV"),
    (["--qps", "1", "--kv-blocks", "0"], "must be a positive integer"),
    (["--qps", "1", "--kv-blocks", "8", "--capacity"], "argument --capacity: needs at least one --slo"),
    (["--concurrency", "2", "--kv-blocks", "8", "--capacity", "--slo", "ttft=1s"], "not a closed loop"),
    (["--qps", "1", "--kv-blocks", "8", "--step-workers", "2"], "argument --step-workers: simulates step shapes")])
def test_serve_bad_input(capsys, argv, message):
    assert main(["serve", "--requests", "4", *argv, "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["error"] and message in out["message"], out


def test_serve_csv_never_overwrites_its_trace(capsys, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,4,2\n1,4,2\n")
    assert main(["serve", "--trace", str(trace), "--kv-blocks", "8", "--csv", str(trace)]) == 2
    assert "is the workload trace the run reads" in capsys.readouterr().err
    assert trace.read_text().startswith("arrival_s")
    out = tmp_path / "req.csv"
    for _ in range(2):                                               # its own kind it overwrites
        assert main(["serve", "--trace", str(trace), "--kv-blocks", "8", "--csv", str(out)]) == 0


@pytest.fixture(scope="module")
def tiny_step():
    pytest.importorskip("transformers")
    return serve.SimulatedStep("tiny-qwen2", TINY, held_out=((3, 1, 200), (1, 48, 0)))


def test_simulated_step_model(tiny_step):
    """Decode time grows with context; a batch on grid points is its simulated shape; between
    them the table interpolates linearly over simulated corners, each simulated once; a chunk
    beside decodes adds what the decodes' context costs; the held-out error is reported; the
    machine's digest keys the memo."""
    m = tiny_step
    assert m.shape_ns(1, 1, 512) > m.shape_ns(1, 1, 128) > 0
    done = m.simulated
    batch = tuple(serve.BatchEntry(i, 1, 512, False) for i in range(4))
    assert m.step_ns_of(batch) == m.shape_ns(4, 1, 512)
    mixed = tuple(serve.BatchEntry(i, 1, 100 * i, False) for i in range(1, 4))   # 3 rows, mean context 200
    want = sum(wr * wc * m.shape_ns(r, 1, c) for r, wr in ((2, 0.5), (4, 0.5)) for c, wc in ((128, 0.4375), (256, 0.5625)))
    assert m.step_ns_of(mixed) == pytest.approx(want, rel=1e-12)
    assert m.simulated <= done + 4
    chunk = (serve.BatchEntry(9, 64, 0, True),)
    assert m.step_ns_of(chunk + mixed) == pytest.approx(
        m.prefill_ns(67, 0) + m.decode_ns(3, 200) - m.decode_ns(3, 0), rel=1e-12)
    assert m.step_ns_of(chunk + mixed) > m.step_ns_of(chunk)
    err = m.error()
    assert err["held_out_shapes"] == 2 and 0 <= err["median_rel_error"] < 0.5
    assert m.describe()["machine_digest"] == m.machine.digest
    r = serve.run(serve.synthetic(30, 50.0, {"kind": "uniform", "low": 8, "high": 200}, 8), m, kv_blocks=256)
    assert r.metrics["completed"] == 24 and r.extra["step_model_error"] == err
    assert m.kv_bytes_per_token() > 0 and m.hbm_bytes() > m.weight_bytes() > 0


def test_held_out_shapes_are_drawn_from_the_run():
    """By default the held-out shapes are batches the tables answered during the run, off the
    grid, drawn once (at the first run's end); a bad ``held_out`` is refused by name."""
    pytest.importorskip("transformers")
    from kbtorch.serve.simulated import RUN_HELD_OUT
    m = serve.SimulatedStep("tiny-qwen2", TINY)
    assert m.error()["held_out_shapes"] == 0
    wl = serve.synthetic(30, 50.0, {"kind": "uniform", "low": 8, "high": 200}, 8)
    err = serve.run(wl, m, kv_blocks=256).extra["step_model_error"]
    assert err["held_out_from"] == "run" and 2 <= err["held_out_shapes"] <= 2 * RUN_HELD_OUT
    assert all(tuple(x) in m._asked for x in err["shapes"]) and {x[1] == 1 for x in err["shapes"]} == {True, False}
    assert 0 <= err["median_rel_error"] <= err["p95_rel_error"] <= err["max_rel_error"] < 0.5
    assert serve.run(wl, m, kv_blocks=256).extra["step_model_error"] == err
    with pytest.raises(ValueError, match="held_out='all'"):
        serve.SimulatedStep("tiny-qwen2", TINY, held_out="all")


def test_workers_simulate_the_same_times(monkeypatch):
    """Shapes simulated side by side in two processes (the spawned one cold, this one with its
    memos warm) are the times of this process alone, so a run with workers is the same run."""
    pytest.importorskip("transformers")
    from kbtorch.serve import simulated
    wl = serve.synthetic(30, 50.0, {"kind": "uniform", "low": 8, "high": 200}, 8)
    runs = []
    for workers in (1, 2):
        monkeypatch.setattr(simulated, "_MEMO", {})
        m = serve.SimulatedStep("tiny-qwen2", TINY, workers=workers)
        try:
            r = serve.run(wl, m, kv_blocks=256)
            homes = set(m._workers._home.values()) if m._workers else set()
        finally:
            m.close()
        runs.append((r, dict(simulated._MEMO), homes, m.simulated))
    (one, memo1, _, n1), (two, memo2, homes, n2) = runs
    assert homes == {0, 1} and n1 == n2 == len(memo1) and memo1 == memo2
    assert [x.token_s for x in one.requests] == [x.token_s for x in two.requests] and one.extra == two.extra
    assert m.step_ns_of((serve.BatchEntry(0, 1, 300, False),)) > 0          # closed: answers alone
    with pytest.raises(ValueError, match="workers=0"):
        serve.SimulatedStep("tiny-qwen2", TINY, workers=0)


def test_simulated_step_forward(tiny_step):
    """One forward's profile is what the memo holds; with ``graph`` the forward is one timed
    graph whose record says how it was obtained."""
    prof, g = tiny_step.forward(2, 1, 256)
    assert g is None and float(prof.total_ns) == tiny_step.shape_ns(2, 1, 256)
    assert prof.obtained()["events_simulated"] > 0
    prof, g = tiny_step.forward(2, 1, 256, graph=dict(periodic=False))
    assert g.latency_ns > 0 and g.schedule.result.obtained.method == "simulated"
    assert [r.obtained.method for r in prof.records if r.parts] == ["simulated"]


def test_serve_capacity_json(capsys):
    assert main(["serve", "--requests", "200", "--qps", "4", "--kv-blocks", "2048", "--step-ns", "2e7", "--slo", "ttft=2s",
                 "--slo", "tpot=200ms", "--capacity", "--tolerance", "0.05", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    trials = out["trials"]
    assert trials[0]["qps"] == 4 and out["capacity_qps"] == max(t["qps"] for t in trials if t["met"])
    assert out["first_failing_qps"] == min(t["qps"] for t in trials if not t["met"])
    assert out["first_failing_qps"] / out["capacity_qps"] - 1 <= 0.05
    assert out["best"]["metrics"]["label"] == "stable"


def test_serve_chrome_trace(tmp_path, capsys):
    path = tmp_path / "serve.json"
    assert main(["serve", "--requests", "30", "--qps", "5", "--kv-blocks", "512", "--replicas", "2",
                 "--chrome-trace", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    events = json.loads(path.read_text())["traceEvents"]
    steps = [e for e in events if e.get("cat") == "step"]
    assert len(steps) == out["steps"] and {e["tid"] for e in steps} == {2, 3}
    assert all(e["dur"] > 0 and e["args"]["seqs"] >= 1 for e in steps)
    assert sum(e["ph"] == "C" for e in events) == len(steps)
    assert sum(e["name"].startswith("request ") for e in events) == 30
    assert main(["serve", "--requests", "30", "--qps", "5", "--kv-blocks", "512", "--chrome-trace", str(path)]) == 0
    (tmp_path / "mine.txt").write_text("mine")                    # NOTE: another kind of file is never overwritten
    assert main(["serve", "--requests", "3", "--qps", "5", "--kv-blocks", "8", "--chrome-trace",
                 str(tmp_path / "mine.txt")]) == 2
    assert (tmp_path / "mine.txt").read_text() == "mine"
