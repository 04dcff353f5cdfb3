"""Sweep throughput: the speedup of 2 workers over 1 on a 64-point sweep of small workloads,
and the per-point overhead of the sweep machinery (a sweep of trivial points / points).

    python benchmarks/bench_sweep.py            # about 1.5 minutes on 2 cores
    python benchmarks/bench_sweep.py --quick    # 32 points instead of 64

(a) 64 small GEMMs on the tiny topology (4 NoC bandwidths x 16 K sizes, each point a
fraction of a second of simulation), run in process (``--workers 1``), then on a 2-worker
Dask LocalCluster: end to end (cluster start included) and on the already started cluster
(``scheduler=``), which is what a sweep of more points converges to. (b) 256 trivial points
(a function returning a constant), in process and on the 2-worker cluster: wall / points.
Each run uses a fresh store, so every point runs.
"""
from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import finish  # noqa: E402

import kbtorch.sweep as sweep  # noqa: E402

TINY = Path(__file__).resolve().parents[1] / "tests" / "data" / "tiny.toml"
SMALL = """[sweep]
topology = "{tiny}"
[axes]
"links.noc.bw_gbps" = [64, 128, 256, 512]
[workloads.g]
op = "gemm"
m = 512
n = 512
k = [{ks}]
tile = [64, 64, 128]
grid = [2, 4, 1]
"""
TRIVIAL = """[sweep]
topology = "{tiny}"
[workloads.t]
fn = "bench_sweep:trivial"
i = [{ids}]
"""


def trivial(machine, i=0):
    """A point that costs nothing: what remains is the sweep's own overhead."""
    return {"latency_ns": float(i)}


def _timed(spec: Path, tmp: Path, tag: str, **kw) -> float:
    t0 = time.perf_counter()
    df = sweep.run(spec, store=str(tmp / f"{tag}.sqlite"), progress=False, **kw)
    assert df["error"].isna().all(), df["error"].dropna().tolist()[:3]
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    from distributed import Client, LocalCluster
    t0 = time.perf_counter()
    n_k = 8 if args.quick else 16
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        small = tmp / "small.toml"
        small.write_text(SMALL.format(tiny=TINY, ks=", ".join(str(256 * (i + 1)) for i in range(n_k))))
        trivial_spec = Path(__file__).resolve().parent / "_trivial_sweep.toml"
        trivial_spec.write_text(TRIVIAL.format(tiny=TINY, ids=", ".join(map(str, range(256)))))
        try:
            one = _timed(small, tmp, "one", workers=1)
            two = _timed(small, tmp, "two", workers=2)
            start = time.perf_counter()
            with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None,
                              silence_logs=logging.ERROR) as cluster, Client(cluster):
                started = time.perf_counter() - start
                warm = _timed(small, tmp, "warm", scheduler=cluster.scheduler_address)
                triv_dask = _timed(trivial_spec, tmp, "triv_dask", scheduler=cluster.scheduler_address)
            triv_one = _timed(trivial_spec, tmp, "triv_one", workers=1)
        finally:
            trivial_spec.unlink()
    points = 4 * n_k
    print(f"(a) {points} small GEMM points: 1 worker {one:.1f} s; 2 workers {two:.1f} s end to end "
          f"(cluster start {started:.1f} s), {warm:.1f} s on a started cluster")
    print(f"(b) 256 trivial points: in process {1000 * triv_one / 256:.2f} ms/point, "
          f"on the 2-worker cluster {1000 * triv_dask / 256:.2f} ms/point")
    targets = [
        {"target": f"{points}-point sweep, 2 workers >= 1.6x faster than 1 (started cluster)",
         "measured": f"{one / warm:.2f}x", "pass": one / warm >= 1.6},
        {"target": "... end to end, cluster start included", "measured": f"{one / two:.2f}x",
         "pass": one / two >= 1.6},
        {"target": "per-point overhead < 50 ms (in process)", "measured": f"{1000 * triv_one / 256:.2f} ms",
         "pass": triv_one / 256 < 0.05},
        {"target": "per-point overhead < 50 ms (2-worker cluster)", "measured": f"{1000 * triv_dask / 256:.2f} ms",
         "pass": triv_dask / 256 < 0.05},
    ]
    finish(targets, t0, args.json, {"one_s": one, "two_s": two, "warm_s": warm, "cluster_start_s": started,
                                    "trivial_in_process_s": triv_one, "trivial_dask_s": triv_dask})
    return 0


if __name__ == "__main__":
    sys.exit(main())
