"""Run a sweep: the points not yet in the store, in chunks, in process or on Dask distributed.

A point's key is a hash of what decides its result: the resolved topology CONTENT (the file's
document with the point's overrides applied: an edited file is a new machine, a touched one
is not), the op and its params, the kbtorch version and the limits in force
(``limits.in_force``). The driver resolves and checks each distinct machine once and ships
the checked document with its points: the worker builds the machine from it without reading
or checking the file again (``machine_of_doc``; one per content per process).

Each task runs a chunk of points that share a machine where possible (points are ordered by
topology and overrides first). The driver writes every finished chunk to the store at once,
so a killed or interrupted sweep resumes with the rest. Each point runs within the per-point
wall time and memory limits (``guard``).
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .. import limits
from ..topology.load.cache import content_digest
from ..topology.load.pipeline import resolve_doc
from ..topology.machine import machine_of_doc, topology_path
from ..topology.load.sources import source_files
from ..topology.load.validate import element_limit
from .spec import STUDY_DIR, Spec, load_spec
from .store import Store, StoreError, point_key
from .workloads import add_paths, run_point

__all__ = ["SweepResult", "SweepInterrupted", "SweepStalled", "execute", "default_store", "chunks_of", "keyed_points"]

#: Seconds to wait for a ``--scheduler`` address to answer.
SCHEDULER_TIMEOUT_S = 3.0
#: Seconds a Dask sweep waits past a chunk's time limit for any chunk to finish, before it
#: stops as stalled (a worker stuck where the per-point limit cannot interrupt it).
STALL_GRACE_S = 60.0
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
    #: Points found in the store (not run again).
    reused: int = 0
    #: Damaged store rows skipped: ``(rowid, key, fault)``.
    damaged: tuple = ()

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


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep: the finished chunks are stored; running it again resumes."""

    def __init__(self, store: str, stored: int, left: int):
        super().__init__(f"{stored} point(s) of this run stored in '{store}', {left} left; "
                         f"run the sweep again to resume")


class SweepStalled(RuntimeError):
    """No chunk of a Dask sweep finished within its time limit (a worker is stuck)."""

    def __init__(self, stall_s: float):
        super().__init__(f"no point finished in {stall_s:g} s: a worker is stuck in a call that does not return "
                         f"to Python, where the per-point time limit cannot stop it; the finished points are "
                         f"stored, run the sweep again to resume (the stuck point runs again)")


def chunks_of(items: list, workers: int) -> list:
    size = max(1, min(CHUNK_MAX, math.ceil(len(items) / (8 * max(1, workers)))))
    return [items[i:i + size] for i in range(0, len(items), size)]


def run_chunk(points: list, paths: list, docs: dict, seconds: float | None, nbytes: int | None,
              store: str | None = None) -> list:
    """A task: run each point of the chunk in turn on the machine of its checked document
    (``docs``: ``{(path, overrides): doc}``) -> their figures (import paths set first);
    ``store``: the sweep's store path, given to workloads that take it."""
    add_paths(paths)
    out = []
    for p in points:
        path, doc = docs[(p.topology, p.overrides)]
        out.append(run_point(p, machine_of_doc(path, doc), seconds, nbytes, store))
    return out


def keyed_points(spec: Spec) -> tuple[list, dict]:
    """``[(key, point)]`` in spec order and the checked document of each machine, resolved and
    checked once per distinct topology + overrides."""
    docs, digests = {}, {}
    for p in spec.points:
        ident = (p.topology, p.overrides)
        if ident not in docs:
            path = os.path.abspath(topology_path(p.topology))
            docs[ident] = (path, resolve_doc(path, dict(p.overrides) or None))
            digests[ident] = content_digest(docs[ident][1])
    force = {**limits.in_force(), "KBTORCH_MAX_ELEMENTS": element_limit(spec.path)}
    keyed = [(point_key({"machine": digests[(p.topology, p.overrides)], "op": p.op, "params": dict(p.params),
                         "limits": force}), p) for p in spec.points]
    return keyed, docs


def execute(spec_or_path, *, workers: int | None = None, scheduler: str | None = None, store: str | None = None,
            progress: bool = True, retry_failed: bool = False, point_timeout_s: float | None = None,
            point_bytes: int | None = None) -> SweepResult:
    """Run the points of a spec missing from its store (with ``retry_failed``, the stored
    failures too); -> every point's row, in spec order. The store is opened and checked
    before any point runs; each point runs within ``point_timeout_s`` and ``point_bytes``
    (default: ``KBTORCH_MAX_POINT_S``, ``KBTORCH_MAX_POINT_BYTES``)."""
    spec = spec_or_path if isinstance(spec_or_path, Spec) else load_spec(spec_or_path)
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if scheduler is not None:
        probe_scheduler(scheduler)
    seconds = limits.limit("point_s") if point_timeout_s is None else point_timeout_s
    nbytes = limits.limit("point_bytes") if point_bytes is None else point_bytes
    keyed, docs = keyed_points(spec)
    store = default_store(spec) if store is None else store
    _not_a_topology(store, {path for path, _ in docs.values()})
    db = Store(store, spec.path)
    t0 = time.perf_counter()
    ran, todo, unique, damaged = 0, [], len({k for k, _ in keyed}), ()
    try:
        done = db.keys(retry_failed)
        damaged = tuple(db.damaged)
        todo = list({k: p for k, p in keyed if k not in done}.items())
        todo.sort(key=lambda kp: (kp[1].topology, json.dumps(kp[1].overrides)))
        failed = 0
        with _bar(unique, unique - len(todo), progress) as bar:
            tasks = chunks_of(todo, workers)
            for chunk, figures in _results(tasks, list(spec.import_paths), docs, workers, scheduler, seconds, nbytes,
                                           db.path):
                db.put(spec.name, [(k, p.canonical(), _row(k, p, f)) for (k, p), f in zip(chunk, figures)])
                ran += len(chunk)
                failed += sum(1 for f in figures if f.get("error"))
                bar.update(len(chunk))
                bar.set_postfix(failed=failed)
        stored = db.rows([k for k, _ in keyed])
        rows = tuple(stored[k] for k, _ in keyed if k in stored)
    except KeyboardInterrupt:
        raise SweepInterrupted(db.path, ran, len(todo) - ran) from None
    finally:
        db.close()
    return SweepResult(spec, db.path, rows, len(todo), time.perf_counter() - t0, unique - len(todo), damaged)


def _not_a_topology(store: str, paths) -> None:
    """StoreError if the store is a topology or chip file the sweep reads (never overwritten)."""
    for path in paths:
        for f in source_files(path):
            if os.path.realpath(store) == os.path.realpath(f):
                what = "topology" if f == path else "chip"
                raise StoreError(store, f"is the {what} file {Path(f).name} the sweep reads (give the store another name)")


def probe_scheduler(address: str, timeout_s: float = SCHEDULER_TIMEOUT_S) -> None:
    """ValueError naming ``address`` unless a TCP connection to it opens within ``timeout_s``
    (before the store is opened or any point is run)."""
    if not isinstance(address, str):
        raise ValueError(f"argument --scheduler: expected an address like tcp://host:8786, got {address!r}")
    scheme, sep, _ = address.strip().partition("://")
    if sep and scheme not in ("tcp", "tls", "ws", "wss"):
        return          # NOTE: other transports (inproc, ucx) are Dask's to reach, with the client's timeout
    m = re.fullmatch(r"(?:\w+://)?\[?([^\[\]/]+?)\]?:(\d{1,5})/?", address.strip())
    if m is None or not 0 < int(m.group(2)) < 65536:
        raise ValueError(f"argument --scheduler: '{address}' is not a Dask scheduler address like tcp://host:8786")
    try:
        socket.create_connection((m.group(1), int(m.group(2))), timeout=timeout_s).close()
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise ValueError(f"argument --scheduler: cannot reach the Dask scheduler at '{address}' "
                         f"within {timeout_s:g} s: {why}") from None


def _bar(total: int, initial: int, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, unit="pt", file=sys.stderr, disable=not enabled, dynamic_ncols=True)


def _results(chunks: list, paths: list, docs: dict, workers: int, scheduler: str | None, seconds, nbytes, store):
    """Yield ``(chunk, figures)`` as chunks finish: in process for one worker, else on Dask."""
    if not chunks:
        return
    if workers == 1 and scheduler is None:
        for chunk in chunks:
            yield chunk, run_chunk([p for _, p in chunk], paths, docs, seconds, nbytes, store)
        return
    import dask
    from distributed import Client, LocalCluster, wait
    # NOTE: local workers are forked from this process, which has kbtorch and torch imported
    # already: a cluster starts in about a second instead of the ~9 s of spawned workers
    # importing torch. The driver runs no torch kernels before the fork (timing-only points
    # run in the workers), so no thread pool is forked half-initialised.
    with dask.config.set({"distributed.worker.multiprocessing-method": "fork"}), _workers_ignore_ctrl_c():
        cluster = None if scheduler else LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                                       dashboard_address=None, silence_logs=logging.ERROR)
    client = Client(scheduler, timeout=f"{3 * SCHEDULER_TIMEOUT_S:g}s") if scheduler else Client(cluster)
    try:
        futures = {client.submit(run_chunk, [p for _, p in c], paths, _docs_of(c, docs), seconds, nbytes, store,
                                 pure=False): c for c in chunks}
        # NOTE: a worker stuck in a call that never returns to Python (where the per-point
        # limit cannot reach it) must not hang the sweep: if no chunk finishes within a whole
        # chunk's time limit plus STALL_GRACE_S, the sweep stops with what finished stored.
        stall_s = max(map(len, chunks)) * seconds + STALL_GRACE_S if seconds else None
        pending = set(futures)
        while pending:
            try:
                done, pending = wait(pending, timeout=stall_s, return_when="FIRST_COMPLETED")
            except TimeoutError:
                done = ()
            if not done:
                raise SweepStalled(stall_s)
            for fut in done:
                yield futures[fut], fut.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


@contextlib.contextmanager
def _workers_ignore_ctrl_c():
    """Worker processes forked inside this block ignore SIGINT: a Ctrl-C (sent to the whole
    process group) stops the driver alone, which stores what finished and closes the cluster,
    instead of every worker printing its own traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _docs_of(chunk: list, docs: dict) -> dict:
    """The documents of a chunk's machines (what its task needs, not every machine's)."""
    return {(p.topology, p.overrides): docs[(p.topology, p.overrides)] for _, p in chunk}
