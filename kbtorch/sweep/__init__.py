"""Design-space sweeps: hardware axes x workloads, run on Dask, stored in SQLite, plotted.

``run(spec_or_path) -> pandas.DataFrame`` (one row per point); ``kbtorch sweep SPEC.toml``
on the command line. Dask, pandas, tqdm and matplotlib come with the ``[sweep]`` extra and
are imported only when a sweep runs, never by ``import kbtorch``.
"""
from __future__ import annotations

from .runner import execute
from .spec import Spec, SpecError, load_spec

__all__ = ["run", "frame", "FIGURES", "load_spec", "Spec", "SpecError"]


#: Figure columns, after the point's own (key, workload, topology, axes, params).
FIGURES = ("latency_ns", "bottleneck", "pct_peak", "pct_bound", "plan", "events", "wall_s", "error")


def frame(rows, spec: Spec):
    """A DataFrame of sweep rows: the point's columns, the figures, then ``ns_<kind>`` (sorted)."""
    import pandas as pd
    df = pd.DataFrame(list(rows))
    params = dict.fromkeys(n for w in spec.workloads for n, _ in (*w.fixed, *w.swept))
    axes = [a.name for a in spec.axes] or [c for p in spec.points[:1] for c, _ in p.axes]
    lead = list(dict.fromkeys(["key", "workload", "topology", *axes, *params, *FIGURES]))
    kinds = sorted(c for c in df.columns if c.startswith("ns_"))
    for col in lead:
        if col not in df.columns:
            df[col] = None
    return df[lead + kinds + sorted(set(df.columns) - set(lead) - set(kinds))]


def run(spec_or_path, *, workers: int | None = None, scheduler: str | None = None, store: str | None = None,
        progress: bool = True, **options):
    """Run the points of a sweep spec missing from its store (default ``SPEC.sqlite``) on
    ``workers`` processes (a Dask LocalCluster; 1: in process) or an existing ``scheduler``
    -> a DataFrame of every point (params, key, latency_ns, ns_<kind>, bottleneck, pct_peak,
    pct_bound, events, wall_s, error). ``options``: ``retry_failed``, ``point_timeout_s``,
    ``point_bytes`` (see ``runner.execute``)."""
    result = execute(spec_or_path, workers=workers, scheduler=scheduler, store=store, progress=progress, **options)
    return frame(result.rows, result.spec)
