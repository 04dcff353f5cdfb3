"""Serving sweeps: the step cache that survives in a sweep's store, the sweep workload
(``kbtorch.serve.sweep:point``), the store path given to workloads that take it, and the
serving plots."""
import json
import sqlite3
from pathlib import Path

import pytest

import kbtorch.serve as serve
from kbtorch.cli import main
from kbtorch.serve import cache as step_cache
from kbtorch.serve.cache import StepCache

TINY = str(Path(__file__).parent / "data" / "tiny.toml")


def test_step_cache_round_trip_and_version(tmp_path, monkeypatch):
    path = tmp_path / "steps.sqlite"
    c = StepCache(path)
    key = ("digest", "model", "cfg", "plan", 3, 1, 700)
    assert c.get(key) is None
    c.put(key, 1234.5678901234)
    assert c.get(key) == 1234.5678901234 and len(c) == 1
    c.close()
    assert StepCache(path).get(key) == 1234.5678901234          # survives the process's handle
    monkeypatch.setattr(step_cache, "version", lambda: "0.0.0-other")
    assert StepCache(path).get(key) is None                      # another version's time is never read


def test_step_cache_refuses_what_it_would_overwrite(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("keep me")
    with pytest.raises(ValueError, match="not an SQLite file"):
        StepCache(text)
    assert text.read_text() == "keep me"
    with pytest.raises(ValueError, match="is a directory"):
        StepCache(tmp_path)
    other = tmp_path / "other.sqlite"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE serve_steps (a TEXT)")
    db.commit()
    db.close()
    with pytest.raises(ValueError, match="has columns \\['a'\\]"):
        StepCache(other)


@pytest.fixture()
def fresh_memo(monkeypatch):
    pytest.importorskip("transformers")
    from kbtorch.serve import simulated
    monkeypatch.setattr(simulated, "_MEMO", {})
    return simulated


def test_simulated_step_reads_the_cache_instead_of_simulating(tmp_path, fresh_memo):
    path = str(tmp_path / "steps.sqlite")
    first = serve.SimulatedStep("tiny-qwen2", TINY, held_out=(), cache=path)
    ns = first.shape_ns(2, 1, 100)
    assert (first.simulated, first.cached) == (1, 0)
    fresh_memo._MEMO.clear()                                      # a new process: only the file remembers
    again = serve.SimulatedStep("tiny-qwen2", TINY, held_out=(), cache=path)
    assert again.shape_ns(2, 1, 100) == ns
    assert (again.simulated, again.cached) == (0, 1) and again.describe()["step_cache"] == path


def test_sweep_point_serves_and_a_second_run_is_warm(tmp_path, fresh_memo):
    """The workload's figures; run again with an empty memo, every step time is read from
    the store and the figures are the same."""
    from kbtorch.serve.sweep import point
    from kbtorch.topology.machine import load_machine
    machine, store = load_machine(TINY), str(tmp_path / "s.sqlite")
    kw = dict(model="tiny-qwen2", trace="azure-code", requests=40, qps=2.0)
    row = point(machine, store=store, **kw)
    assert row["completed"] == 32 and row["label"] == "stable" and row["simulated_shapes"] > 0
    assert row["latency_ns"] == pytest.approx(row["mean_e2el_ms"] * 1e6)
    assert row["goodput_per_chip"] == row["request_goodput"] / row["chips"]
    fresh_memo._MEMO.clear()
    warm = point(machine, store=store, **kw)
    assert warm["simulated_shapes"] == 0 and warm["cached_shapes"] == row["simulated_shapes"]
    assert {k: v for k, v in warm.items() if not k.endswith("_shapes")} == \
        {k: v for k, v in row.items() if not k.endswith("_shapes")}


def test_sweep_point_capacity(tmp_path, fresh_memo):
    from kbtorch.serve.sweep import point
    from kbtorch.topology.machine import load_machine
    row = point(load_machine(TINY), store=str(tmp_path / "s.sqlite"), model="tiny-qwen2", trace="azure-code",
                requests=40, qps=4.0, capacity=True, ttft="1ms", tpot="50us", tolerance=0.2)
    assert row["capacity_qps"] is None or row["capacity_qps"] < 4.0 <= row["first_failing_qps"] * 1.0001
    assert row["trials"] >= 2


STORE_FN = '''
def record(machine, store=None, x=1):
    return {"latency_ns": float(x), "store": store}
'''


def test_the_sweep_gives_its_store_to_a_workload_that_takes_it(tmp_path, capsys):
    (tmp_path / "storefn.py").write_text(STORE_FN)
    spec = tmp_path / "s.toml"
    spec.write_text('[sweep]\nname = "s"\ntopology = "ahbm"\n\n[workloads.w]\nfn = "storefn:record"\nx = [1, 2]\n')
    store = tmp_path / "s.sqlite"
    assert main(["sweep", str(spec), "--store", str(store), "--workers", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["store"] for r in rows] == [str(store)] * 2
    spec.write_text('[sweep]\nname = "s"\ntopology = "ahbm"\n\n[workloads.w]\nfn = "storefn:record"\nstore = "x"\n')
    assert main(["sweep", str(spec), "--store", str(store), "--workers", "1", "--json"]) == 2
    assert "workloads.w.store" in capsys.readouterr().out         # the sweep fills it, never the spec


@pytest.fixture()
def plt():
    return pytest.importorskip("matplotlib")


def test_plots_write_pngs(tmp_path, plt):
    wl = serve.synthetic(200, qps=20.0, input_tokens=256, output_tokens=32, seed=1)
    result = serve.run(wl, serve.ConstantStep(step_ns=5e6), kv_blocks=256, replicas=2)
    out = serve.plot_timeline(result, str(tmp_path / "kv.png"))
    assert Path(out).read_bytes()[:4] == b"\x89PNG"
    trials = [serve.Trial(1.0, True, "", "stable", {"ttft": 10.0, "tpot": 5.0}),
              serve.Trial(2.0, False, "P99 ttft", "backlogged", {"ttft": 3000.0, "tpot": 6.0})]
    out = serve.plot_latency_qps({"a": trials, "b": [(1.0, {"ttft": 20.0})]}, str(tmp_path / "q.png"),
                                 {"ttft": "2s", "tpot": "200ms"})
    assert Path(out).read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="no P99 figures"):
        serve.plot_latency_qps({"a": []}, str(tmp_path / "x.png"))


def test_cli_plot(tmp_path, capsys, plt):
    png = tmp_path / "kv.png"
    argv = ["serve", "--requests", "60", "--qps", "5", "--kv-blocks", "512", "--step-ns", "5e6"]
    assert main([*argv, "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    assert main([*argv, "--plot", str(notes), "--json"]) == 2
    assert "argument --plot" in json.loads(capsys.readouterr().out)["message"] and notes.read_text() == "keep me"
    qps = tmp_path / "qps.png"
    assert main([*argv, "--capacity", "--slo", "ttft=100ms", "--tolerance", "0.2", "--plot", str(qps)]) == 0
    assert qps.read_bytes()[:4] == b"\x89PNG"


def test_serve_cli_step_cache(tmp_path, capsys, fresh_memo):
    path = str(tmp_path / "steps.sqlite")
    argv = ["serve", "--topology", TINY, "--step", "simulated", "--model", "tiny-qwen2", "--step-cache", path,
            "--requests", "3", "--qps", "2", "--input-tokens", "48", "--output-tokens", "3", "--json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)["step_model"]
    assert first["simulated_shapes"] > 0 and first["cached_shapes"] == 0 and first["step_cache"] == path
    fresh_memo._MEMO.clear()
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out)["step_model"]
    assert (again["simulated_shapes"], again["cached_shapes"]) == (0, first["simulated_shapes"])
    assert main(["serve", "--kv-blocks", "8", "--step-cache", path, "--json"]) == 2
    assert "--step-cache" in capsys.readouterr().out
    assert main(argv[:-1] + ["--csv", path]) == 2               # the cache is an input: never overwritten
    assert "is the step cache the run keeps" in capsys.readouterr().err
