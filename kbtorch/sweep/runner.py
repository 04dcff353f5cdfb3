"""Run a sweep: the points not yet in the store, in chunks, in process or on Dask distributed.

Each task runs a chunk of points that share a machine where possible (points are ordered by
topology and overrides first), so a worker compiles each topology + overrides once:
``load_machine`` caches on the file, its mtime and the frozen overrides. The driver writes
every finished chunk to the store at once, so a killed sweep resumes with the rest.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .spec import STUDY_DIR, Spec, load_spec
from .store import Store, point_key
from .workloads import add_paths, run_point

__all__ = ["SweepResult", "execute", "default_store", "chunks_of"]

#: Points a chunk holds at most (with fewer points, chunks shrink so every worker gets ~8:
#: the last chunks to finish decide how well the workers balance).
CHUNK_MAX = 8


@dataclass(frozen=True)
class SweepResult:
    """What a call of :func:`execute` did: the spec, the store, all rows and the points it ran."""

    spec: Spec
    store_path: str
    rows: tuple
    ran: int
    wall_s: float

    @property
    def failures(self) -> list:
        return [r for r in self.rows if r.get("error")]


def default_store(spec: Spec) -> str:
    """``study.toml`` -> ``study.sqlite`` beside it; a shipped study's in the working directory
    (NOTE: never inside the installed package)."""
    path = Path(spec.path)
    if path.resolve().parent == STUDY_DIR.resolve():
        return str(Path.cwd() / path.with_suffix(".sqlite").name)
    return str(path.with_suffix(".sqlite"))


def _cell(value):
    """A param as a table cell: lists (PE lists, shapes) as ``a,b,c``."""
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value


def _row(key: str, point, figures: dict) -> dict:
    row = {"key": key, "workload": point.workload, "topology": Path(point.topology).stem}
    row.update({name: _cell(v) if name != "topology" else Path(v).stem for name, v in point.axes})
    row.update({name: _cell(v) for name, v in point.params})
    row.update({"error": None, **figures})
    return row


def chunks_of(items: list, workers: int) -> list:
    size = max(1, min(CHUNK_MAX, math.ceil(len(items) / (8 * max(1, workers)))))
    return [items[i:i + size] for i in range(0, len(items), size)]


def run_chunk(points: list, paths: list) -> list:
    """A task: run each point of the chunk in turn -> their figures (import paths set first)."""
    add_paths(paths)
    return [run_point(p) for p in points]


def execute(spec_or_path, *, workers: int | None = None, scheduler: str | None = None, store: str | None = None,
            progress: bool = True) -> SweepResult:
    """Run the points of a spec missing from its store; -> every point's row, in spec order."""
    spec = spec_or_path if isinstance(spec_or_path, Spec) else load_spec(spec_or_path)
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    db = Store(store or default_store(spec))
    t0 = time.perf_counter()
    try:
        keyed = [(point_key(p.canonical()), p) for p in spec.points]
        done = db.keys()
        todo = list({k: p for k, p in keyed if k not in done}.items())
        todo.sort(key=lambda kp: (kp[1].topology, json.dumps(kp[1].overrides)))
        failed = 0
        with _bar(len(keyed), len(keyed) - len(todo), progress) as bar:
            for chunk, figures in _results(chunks_of(todo, workers), list(spec.import_paths), workers, scheduler):
                db.put(spec.name, [(k, p.canonical(), _row(k, p, f)) for (k, p), f in zip(chunk, figures)])
                failed += sum(1 for f in figures if f.get("error"))
                bar.update(len(chunk))
                bar.set_postfix(failed=failed)
        stored = db.rows([k for k, _ in keyed])
        rows = tuple(stored[k] for k, _ in keyed if k in stored)
    finally:
        db.close()
    return SweepResult(spec, db.path, rows, len(todo), time.perf_counter() - t0)


def _bar(total: int, initial: int, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, unit="pt", file=sys.stderr, disable=not enabled, dynamic_ncols=True)


def _results(chunks: list, paths: list, workers: int, scheduler: str | None):
    """Yield ``(chunk, figures)`` as chunks finish: in process for one worker, else on Dask."""
    if not chunks:
        return
    if workers == 1 and scheduler is None:
        for chunk in chunks:
            yield chunk, run_chunk([p for _, p in chunk], paths)
        return
    import dask
    from distributed import Client, LocalCluster, as_completed
    # NOTE: local workers are forked from this process, which has kbtorch and torch imported
    # already: a cluster starts in about a second instead of the ~9 s of spawned workers
    # importing torch. The driver runs no torch kernels before the fork (timing-only points
    # run in the workers), so no thread pool is forked half-initialised.
    with dask.config.set({"distributed.worker.multiprocessing-method": "fork"}):
        cluster = None if scheduler else LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                                       dashboard_address=None, silence_logs=logging.ERROR)
    client = Client(scheduler or cluster)
    try:
        futures = {client.submit(run_chunk, [p for _, p in c], paths, pure=False): c for c in chunks}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
