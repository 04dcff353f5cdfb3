"""``kbtorch sweep SPEC.toml``: run a design-space sweep (``kbtorch.sweep``), resumable, with a
progress bar on stderr (silent under ``--json``), exports and plots. The spec and the outputs
are checked before any point runs; a sweep whose points failed exits with status 1 and a
summary of the failures by cause. Needs the ``sweep`` extra (a checkout:
``pip install -e ".[sweep]"``; a wheel: ``pip install "kbtorch[sweep]"``).

Its modules are imported only when the command runs.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from .cli_common import _byte_count, _positive_int, check_output, positive_float, topology_inputs

EXPORTS = ("csv", "parquet", "md")
#: Columns of the text table (the figures; ns_<kind> columns are in the exports).
SHOWN = ("latency_ns", "bottleneck", "pct_peak", "pct_bound", "error")


def add_parser(sub, common) -> None:
    p = sub.add_parser("sweep", parents=[common], help="design-space sweep from a spec (needs the [sweep] extra)",
                       description=__doc__.split("\n\n")[0].replace("``", "'"))
    p.add_argument("spec", metavar="SPEC.toml", help="sweep spec: a path, or a shipped study by name (gemm_composite, ...; see docs/sweeps.md)")
    p.add_argument("--workers", type=_positive_int, help="worker processes (default: one per core; 1: in process)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="an existing Dask scheduler (e.g. tcp://host:8786)")
    p.add_argument("--store", metavar="PATH", help="results database (default: SPEC.sqlite beside the spec; for a shipped study by name, "
                   "in the current directory)")
    p.add_argument("--export", nargs=2, metavar=("csv|parquet|md", "PATH"), help="write every point's row to PATH")
    p.add_argument("--plot", metavar="DIR", help="write PNG plots to DIR")
    p.add_argument("--retry-failed", action="store_true", help="run the points stored as failed again")
    p.add_argument("--point-timeout", type=positive_float("a positive number of seconds"), metavar="S",
                   help="wall seconds a point may run (default $KBTORCH_MAX_POINT_S or 3600)")
    p.add_argument("--point-memory", type=_byte_count, metavar="BYTES",
                   help="memory a point may take, e.g. 4GiB (default $KBTORCH_MAX_POINT_BYTES or 8GiB)")
    p.set_defaults(func=_cmd_sweep, needs_machine=False)



def _check_extras(args) -> None:
    missing = [m for m in ("dask", "distributed", "pandas", "tqdm", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"kbtorch sweep needs {', '.join(missing)} (the optional extra 'sweep'): "
                         f"pip install -e \".[sweep]\" (a clone) or pip install \"kbtorch[sweep]\" (a wheel)")
    if args.export:
        fmt = args.export[0]
        if fmt not in EXPORTS:
            raise ValueError(f"argument --export: unknown format '{fmt}' (choose from {', '.join(EXPORTS)})")
        if fmt == "parquet" and importlib.util.find_spec("pyarrow") is None:
            raise ValueError("argument --export: parquet needs pyarrow (pip install pyarrow), or export csv")


def causes(failures: list) -> list:
    """Failures grouped by their error: ``[{error, points, workloads}]``, the most common first."""
    by: dict = {}
    for f in failures:
        entry = by.setdefault(f["error"], {"error": f["error"], "points": 0, "workloads": []})
        entry["points"] += 1
        if f["workload"] not in entry["workloads"]:
            entry["workloads"].append(f["workload"])
    return sorted(by.values(), key=lambda c: -c["points"])


def _check_outputs(args, spec) -> None:
    """ValueError naming the option unless ``--export`` and ``--plot`` can be written without
    overwriting an input: the store, the spec, a topology or chip file (before any point runs)."""
    from .sweep.runner import default_store
    from .topology.machine import topology_path
    inputs = {spec.path: "the sweep spec", args.store or default_store(spec): "the sweep's store",
              **topology_inputs(dict.fromkeys(topology_path(p.topology) for p in spec.points))}
    if args.export:
        _writable(args.export[1], "--export", directory=False)
        check_output(args.export[1], "--export", inputs, args.export[0])
    if args.plot:
        _writable(args.plot, "--plot", directory=True)
        for other, what in inputs.items():
            name = os.path.basename(other)
            if _same_dir(os.path.dirname(os.path.abspath(other)), args.plot) and name.startswith(f"{spec.name}_") \
                    and name.endswith(".png"):
                raise ValueError(f"argument --plot: '{other}' is {what}, and a plot of that name would replace it "
                                 f"(an output never overwrites an input; give another directory)")


def _same_dir(a: str, b: str) -> bool:
    return os.path.isdir(b) and os.path.samefile(a, b) if os.path.isdir(a) else False


def _writable(path: str, option: str, directory: bool) -> None:
    if not path:
        raise ValueError(f"argument {option}: an empty path")
    target = os.path.abspath(path)
    if os.path.exists(target):
        if os.path.isdir(target) != directory:
            raise ValueError(f"argument {option}: '{path}' is {'not ' if directory else ''}a directory")
        if not os.access(target, os.W_OK):
            raise ValueError(f"argument {option}: '{path}' is not writable")
        return
    parent = os.path.dirname(target)
    while not os.path.exists(parent) and directory:
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"argument {option}: cannot write '{path}': no directory '{os.path.dirname(target)}'")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"argument {option}: cannot write '{path}': '{parent}' is not writable")


def export(df, fmt: str, path: str) -> None:
    """Write the sweep's rows as CSV, Parquet or a markdown table (without the ns_ columns)."""
    if fmt == "csv":
        df.to_csv(path, index=False)
    elif fmt == "parquet":
        df.to_parquet(path, index=False)
    else:
        with open(path, "w") as fh:
            shown = df[[c for c in df.columns if not c.startswith("ns_") and c not in ("key", "wall_s", "events")]]
            fh.write(_blank(shown).to_markdown(index=False, disable_numparse=True) + "\n")


def _blank(df):
    """The cells as text: missing cells (a param another workload has) empty, not ``nan``;
    integers as integers (``37890``, not ``3.789e+04``), other numbers to 4 significant
    digits, and at least to 0.1 from 1000 up (``27449.1`` ns)."""
    return df.astype(object).where(df.notna(), "").map(_cell)


def _cell(v) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if float(v).is_integer():
        return str(int(v))
    return f"{v:.1f}" if abs(v) >= 1000 else f"{v:.4g}"


def _cmd_sweep(args, _machine):
    _check_extras(args)
    from .sweep import frame, load_spec
    from .sweep.plots import plot_all, sensitivity
    from .sweep.runner import execute
    spec = load_spec(args.spec)
    _check_outputs(args, spec)
    result = execute(spec, workers=args.workers, scheduler=args.scheduler, store=args.store,
                     progress=not getattr(args, "json", False), retry_failed=args.retry_failed,
                     point_timeout_s=args.point_timeout, point_bytes=args.point_memory)
    for rowid, key, fault in result.damaged:
        print(f"kbtorch: warning: store '{result.store_path}': row {rowid} (key {str(key)[:12]}) is damaged "
              f"and skipped: {fault}", file=sys.stderr)
    df = frame(result.rows, spec)
    if args.export:
        export(df, *args.export)
    plots = plot_all(df, spec, args.plot) if args.plot else []
    failures = [{"key": r["key"], "workload": r["workload"], "error": r["error"]} for r in result.failures]
    # NOTE: a sweep with failed points exits 1 (2: it was refused before any point ran).
    args.status = 1 if failures else 0
    data = {"spec": spec.name, "points": len(result.rows), "ran": result.ran, "reused": result.reused,
            "damaged": [{"rowid": r, "key": k, "fault": f} for r, k, f in result.damaged], "failed": failures,
            "causes": causes(failures),
            "store": result.store_path, "wall_s": result.wall_s, "plots": plots,
            "sensitivity": sensitivity(df, spec) if spec.axes else {}, "rows": result.rows}
    return data, _text(df, data, {n for w in spec.workloads for n, _ in (*w.fixed, *w.swept)})


def _text(df, data: dict, params: set) -> str:
    # NOTE: an OpRun's ``plan`` figure is hidden, a workload param of that name is not.
    hidden = {"key", "events", "wall_s"} | ({"plan"} - params)
    point_cols = [c for c in df.columns if c not in hidden and not c.startswith("ns_") and c not in SHOWN]
    table = _blank(df[point_cols + [c for c in SHOWN if c in df.columns]]).to_markdown(index=False, disable_numparse=True)
    head = (f"sweep {data['spec']}: {data['points']} points ({data['ran']} run now, {data['reused']} reused from "
            f"{data['store']}) in {data['wall_s']:.1f} s; {len(data['failed'])} failed")
    lines = [head, "", table]
    if data["failed"]:
        lines += ["", "failures:"] + [f"  {f['workload']} ({f['key'][:12]}): {f['error']}" for f in data["failed"]]
        lines += ["", f"{len(data['failed'])} of {data['points']} points failed, by cause:"] + [
            f"  {c['points']} x {c['error']} (workloads: {', '.join(c['workloads'])})" for c in data["causes"]]
    if data["plots"]:
        lines += ["", "plots: " + ", ".join(data["plots"])]
    return "\n".join(lines)
