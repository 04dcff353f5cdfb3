"""Sweep runs: rows and columns, failures recorded, resume after SIGKILL without duplicates."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("pandas")
pytest.importorskip("distributed")
pytest.importorskip("tqdm")

import kbtorch.sweep as sweep  # noqa: E402
from kbtorch.cli import main  # noqa: E402

TINY = str(Path(__file__).parent / "data" / "tiny.toml")
HELPER = '''
def boom(machine, n=1):
    raise RuntimeError(f"no luck with {n}")


def summary(machine, n=1):
    return {"latency_ns": float(n * len(machine.pes)), "bottleneck": "none"}
'''


def _spec(tmp_path, body: str) -> Path:
    (tmp_path / "sweep_helper.py").write_text(HELPER)
    p = tmp_path / "study.toml"
    p.write_text(f'[sweep]\ntopology = "{TINY}"\n' + body)
    return p


def test_rows_columns_and_failures(tmp_path):
    spec = _spec(tmp_path, '[axes]\n"issue.fixed_cycles" = [40, 400]\n[workloads.g]\nop = "gemm"\nm = 64\nn = 64\nk = 64\n'
                 'tile = [32, 32, 64]\ngrid = [[2, 2, 1], [1, 1, 1]]\n'
                 '[workloads.bad]\nfn = "sweep_helper:boom"\nn = 3\n[workloads.s]\nfn = "sweep_helper:summary"\n')
    df = sweep.run(spec, workers=1, progress=False)
    assert len(df) == 2 * 4 and df["key"].is_unique
    assert list(df.columns[:6]) == ["key", "workload", "topology", "issue.fixed_cycles", "m", "n"]
    g = df[df.workload == "g"]
    assert g["error"].isna().all() and (g["latency_ns"] > 0).all() and "ns_gemm" in df.columns
    assert set(g["grid"]) == {"2,2,1", "1,1,1"} and g["pct_peak"].notna().all()
    slow = g.set_index(["issue.fixed_cycles", "grid"])["latency_ns"]
    assert slow[(400, "2,2,1")] > slow[(40, "2,2,1")]
    assert set(df[df.workload == "bad"]["error"]) == {"RuntimeError: no luck with 3"}
    assert set(df[df.workload == "s"]["latency_ns"]) == {8.0}
    again = sweep.run(spec, workers=1, progress=False)          # all stored: nothing runs, same values
    assert again.drop(columns="wall_s").equals(df.drop(columns="wall_s"))


def test_cli_json_export_and_plots(tmp_path, capsys):
    spec = _spec(tmp_path, '[axes]\nlinks.noc.bw_gbps = [128, 256]\nhbm = { path = "components.hbm_slice.channel_gbps", '
                 'scale = [0.5, 1] }\n[workloads.v]\nop = "vector"\nn = 4096\n[workloads.bad]\nfn = "sweep_helper:boom"\n')
    assert main(["sweep", str(spec), "--workers", "1", "--json", "--export", "csv", str(tmp_path / "out.csv"),
                 "--plot", str(tmp_path / "plots")]) == 1          # NOTE: 1: some points failed
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["points"] == 8 and data["ran"] == 8 and len(data["failed"]) == 4 and err == ""
    assert data["causes"] == [{"error": "RuntimeError: no luck with 1", "points": 4, "workloads": ["bad"]}]
    assert (tmp_path / "out.csv").read_text().count("\n") == 9
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "study_hbm.png", "study_heatmap.png", "study_links_noc_bw_gbps.png", "study_sensitivity.png"]
    assert data["sensitivity"]["links.noc.bw_gbps"]["v"] >= 1.0
    assert main(["sweep", str(spec), "--workers", "1", "--export", "xls", "x"]) == 2
    assert "unknown format 'xls'" in capsys.readouterr().err


def test_a_heatmap_only_where_two_axes_are_crossed(tmp_path, capsys):
    """One axis at a time fills only a heatmap's base row and column: no heatmap is drawn."""
    pytest.importorskip("matplotlib")
    spec = tmp_path / "study.toml"
    (tmp_path / "sweep_helper.py").write_text(HELPER)
    spec.write_text(f'[sweep]\ntopology = "{TINY}"\ncombine = "one_at_a_time"\n[axes]\nlinks.noc.bw_gbps = [128, 256]\n'
                    'hbm = { path = "components.hbm_slice.channel_gbps", scale = [0.5, 1] }\n'
                    '[workloads.v]\nop = "vector"\nn = 4096\n')
    assert main(["sweep", str(spec), "--workers", "1", "--json", "--plot", str(tmp_path / "plots")]) == 0
    assert json.loads(capsys.readouterr().out)["points"] == 3
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "study_hbm.png", "study_links_noc_bw_gbps.png", "study_sensitivity.png"]


def _stored(path) -> list:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT key, row FROM points ORDER BY key").fetchall()


def _count(path) -> int:
    """Rows stored so far (0 before the sweep has created its table)."""
    try:
        return len(_stored(path)) if path.exists() else 0
    except sqlite3.OperationalError:
        return 0


def _values(rows) -> dict:
    return {k: {c: v for c, v in json.loads(r).items() if c != "wall_s"} for k, r in rows}


def test_kill_and_resume(tmp_path):
    ks = ", ".join(str(64 * i) for i in range(1, 13))
    spec = _spec(tmp_path, f'[axes]\nlinks.noc.bw_gbps = [128, 256, 512]\n[workloads.g]\nop = "gemm"\nm = 128\nn = 128\n'
                 f'k = [{ks}]\n')
    store = tmp_path / "killed.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from kbtorch.cli import main; sys.exit(main())", "sweep", str(spec), "--workers", "2", "--store",
                             str(store), "--json"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _count(store) < 6:
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)      # the driver and its workers, mid-run
        proc.wait()
    partial = len(_stored(store))
    assert 6 <= partial < 36, partial
    sweep.run(spec, workers=1, store=str(store), progress=False)
    resumed = _stored(store)
    assert len(resumed) == 36 and len({k for k, _ in resumed}) == 36
    sweep.run(spec, workers=1, store=str(tmp_path / "clean.sqlite"), progress=False)
    assert _values(resumed) == _values(_stored(tmp_path / "clean.sqlite"))


def test_the_tiny_plan_study_runs_on_a_system(tmp_path, capsys):
    """tests/data/tiny_plans.toml, the tiny counterpart of the shipped mixtral_plans study:
    tiny Mixtral on tiny_system (4 chips) under each plan, end to end through `kbtorch sweep`."""
    pytest.importorskip("transformers")
    spec = Path(__file__).parent / "data" / "tiny_plans.toml"
    out = tmp_path / "plans.csv"
    assert main(["sweep", str(spec), "--workers", "1", "--store", str(tmp_path / "s.sqlite"),
                 "--export", "csv", str(out)]) == 0
    assert "| tp_pp " in capsys.readouterr().out
    import pandas as pd
    rows = pd.read_csv(out).set_index("plan")
    assert list(rows.index) == ["tp", "tp_pp", "ep"] and rows["error"].isna().all()
    assert rows.loc["ep", "pct_all_to_all"] > 0 and rows.loc["tp", "pct_all_to_all"] == 0
    assert rows.loc["tp_pp", "pct_pp_sends"] > 0 and rows.loc["ep", "pct_pp_sends"] == 0
    # NOTE: simulated times (deterministic): EP runs each chip's own experts at once.
    assert rows.loc["ep", "latency_ns"] < rows.loc["tp", "latency_ns"] < rows.loc["tp_pp", "latency_ns"]


def test_sweep_tables_print_integers_as_integers():
    pd = pytest.importorskip("pandas")
    from kbtorch.cli_sweep import _blank
    df = pd.DataFrame({"m": [4096, 8192], "ns": [37890.0, 27449.112], "pct": [97.1234, float("nan")]})
    text = _blank(df).to_markdown(index=False, disable_numparse=True)
    assert "37890 " in text and "27449.1 " in text and "97.12 " in text
    assert "e+0" not in text and "nan" not in text
