"""``kbtorch sweep SPEC.toml``: run a design-space sweep (``kbtorch.sweep``), resumable, with a
progress bar on stderr (silent under ``--json``), exports and plots. Needs the ``[sweep]``
extra (``pip install -e ".[sweep]"``); its modules are imported only when the command runs.
"""
from __future__ import annotations

import importlib.util

from .cli_common import _positive_int

EXPORTS = ("csv", "parquet", "md")
#: Columns of the text table (the figures; ns_<kind> columns are in the exports).
SHOWN = ("latency_ns", "bottleneck", "pct_peak", "pct_bound", "error")


def add_parser(sub, common) -> None:
    p = sub.add_parser("sweep", parents=[common], help="design-space sweep from a spec (needs the [sweep] extra)",
                       description=__doc__.split("\n")[0])
    p.add_argument("spec", metavar="SPEC.toml", help="sweep spec: a path, or a shipped study by name (gemm_composite, ...; see docs/sweeps.md)")
    p.add_argument("--workers", type=_positive_int, help="worker processes (default: one per core; 1: in process)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="an existing Dask scheduler (e.g. tcp://host:8786)")
    p.add_argument("--store", metavar="PATH", help="results database (default: SPEC.sqlite beside the spec)")
    p.add_argument("--export", nargs=2, metavar=("csv|parquet|md", "PATH"), help="write every point's row to PATH")
    p.add_argument("--plot", metavar="DIR", help="write PNG plots to DIR")
    p.set_defaults(func=_cmd_sweep, needs_machine=False)


def _check_extras(args) -> None:
    missing = [m for m in ("dask", "distributed", "pandas", "tqdm", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"kbtorch sweep needs {', '.join(missing)}: pip install -e \".[sweep]\"")
    if args.export:
        fmt = args.export[0]
        if fmt not in EXPORTS:
            raise ValueError(f"argument --export: unknown format '{fmt}' (choose from {', '.join(EXPORTS)})")
        if fmt == "parquet" and importlib.util.find_spec("pyarrow") is None:
            raise ValueError("argument --export: parquet needs pyarrow (pip install pyarrow), or export csv")


def export(df, fmt: str, path: str) -> None:
    """Write the sweep's rows as CSV, Parquet or a markdown table (without the ns_ columns)."""
    if fmt == "csv":
        df.to_csv(path, index=False)
    elif fmt == "parquet":
        df.to_parquet(path, index=False)
    else:
        with open(path, "w") as fh:
            shown = df[[c for c in df.columns if not c.startswith("ns_") and c not in ("key", "wall_s", "events")]]
            fh.write(_blank(shown).to_markdown(index=False, floatfmt=".4g") + "\n")


def _blank(df):
    """Missing cells (a param another workload has) as empty cells, not ``nan``."""
    return df.astype(object).where(df.notna(), "")


def _cmd_sweep(args, _machine):
    _check_extras(args)
    from .sweep import frame, load_spec
    from .sweep.plots import plot_all, sensitivity
    from .sweep.runner import execute
    spec = load_spec(args.spec)
    result = execute(spec, workers=args.workers, scheduler=args.scheduler, store=args.store,
                     progress=not getattr(args, "json", False))
    df = frame(result.rows, spec)
    if args.export:
        export(df, *args.export)
    plots = plot_all(df, spec, args.plot) if args.plot else []
    failures = [{"key": r["key"], "workload": r["workload"], "error": r["error"]} for r in result.failures]
    data = {"spec": spec.name, "points": len(result.rows), "ran": result.ran, "failed": failures,
            "store": result.store_path, "wall_s": result.wall_s, "plots": plots,
            "sensitivity": sensitivity(df, spec) if spec.axes else {}, "rows": result.rows}
    return data, _text(df, data)


def _text(df, data: dict) -> str:
    point_cols = [c for c in df.columns if c not in ("key", "plan", "events", "wall_s") and not c.startswith("ns_")
                  and c not in SHOWN]
    table = _blank(df[point_cols + [c for c in SHOWN if c in df.columns]]).to_markdown(index=False, floatfmt=".4g")
    head = (f"sweep {data['spec']}: {data['points']} points ({data['ran']} run now, the rest from {data['store']}) "
            f"in {data['wall_s']:.1f} s; {len(data['failed'])} failed")
    lines = [head, "", table]
    if data["failed"]:
        lines += ["", "failures:"] + [f"  {f['workload']} ({f['key'][:12]}): {f['error']}" for f in data["failed"]]
    if data["plots"]:
        lines += ["", "plots: " + ", ".join(data["plots"])]
    return "\n".join(lines)
