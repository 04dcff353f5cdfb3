"""Plots of a sweep (matplotlib, Agg backend, PNG): the result against each axis, a heatmap of
two axes crossed (``combine = "product"``), and the sensitivity chart that ranks the hardware levers.

Every plot holds the other axes at their base value (``Spec.base``: factor 1, the base
topology, the file's own value), so a curve shows one lever alone. The sensitivity of an
axis for a workload is max/min of the median latency over the axis' values, others at base;
the chart ranks the axes by that ratio's median over the workloads.
"""
from __future__ import annotations

import os

__all__ = ["plot_all", "sensitivity"]


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _at_base(df, spec, keep: tuple):
    """The rows whose axes other than ``keep`` are at their base value."""
    mask = df["error"].isna()
    for axis in spec.axes:
        if axis.name not in keep and axis.name in df.columns:
            mask &= df[axis.name] == _shown(axis, spec.base(axis))
    return df[mask]


def _shown(axis, value):
    return os.path.splitext(os.path.basename(value))[0] if axis.name == "topology" else value


def _values(axis) -> list:
    return [_shown(axis, v) for v in axis.values]


def sensitivity(df, spec) -> dict:
    """``{axis: {workload: max/min of the median latency over the axis, others at base}}``."""
    out = {}
    for axis in spec.axes:
        sub = _at_base(df, spec, (axis.name,))
        med = sub.groupby(["workload", axis.name])["latency_ns"].median()
        out[axis.name] = {w: float(s.max() / s.min()) for w, s in med.groupby(level=0) if len(s) > 1 and s.min() > 0}
    return out


def _metric(df) -> tuple:
    """``pct_peak`` where every measured row has it, else ``latency_ns``."""
    ok = df[df["error"].isna()]
    if "pct_peak" in ok.columns and len(ok) and ok["pct_peak"].notna().all():
        return "pct_peak", "% of peak"
    return "latency_ns", "latency (ns)"


def axis_plot(df, spec, axis, path: str) -> str:
    plt = _plt()
    sub = _at_base(df, spec, (axis.name,))
    metric, label = _metric(sub)
    values = _values(axis)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for wl, rows in sub.groupby("workload", sort=False):
        med = rows.groupby(axis.name)[metric].median()
        xs = [v for v in values if v in med.index]
        ax.plot([values.index(v) for v in xs], [med[v] for v in xs], marker="o", label=str(wl))
    ax.set_xticks(range(len(values)), [f"x{v:g}" if axis.scale else str(v) for v in values])
    ax.set_xlabel(axis.name + (" (factor of the base value)" if axis.scale else ""))
    ax.set_ylabel(label)
    if metric == "latency_ns":
        ax.set_yscale("log")
    ax.set_title(f"{spec.name}: {label} vs {axis.name}")
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
    return _save(fig, path)


def heatmap(df, spec, a, b, workload: str, path: str) -> str:
    plt = _plt()
    sub = _at_base(df, spec, (a.name, b.name))
    sub = sub[sub["workload"] == workload]
    grid = sub.pivot_table(index=a.name, columns=b.name, values="latency_ns", aggfunc="median")
    grid = grid.reindex(index=_values(a), columns=_values(b))
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    im = ax.imshow(grid.values, cmap="viridis_r", aspect="auto")
    ax.set_xticks(range(len(grid.columns)), [str(c) for c in grid.columns])
    ax.set_yticks(range(len(grid.index)), [str(i) for i in grid.index])
    ax.set_xlabel(b.name)
    ax.set_ylabel(a.name)
    for (i, j), v in _cells(grid.values):
        ax.text(j, i, f"{v:.4g}", ha="center", va="center", color="w", fontsize="small")
    fig.colorbar(im, label="latency (ns)")
    ax.set_title(f"{spec.name}: {workload}")
    return _save(fig, path)


def _cells(values):
    return [((i, j), v) for i, row in enumerate(values) for j, v in enumerate(row) if v == v]


def sensitivity_plot(df, spec, path: str) -> str:
    plt = _plt()
    sens = sensitivity(df, spec)
    ranked = sorted(((a, sorted(r.values())) for a, r in sens.items() if r), key=lambda ar: ar[1][len(ar[1]) // 2])
    fig, ax = plt.subplots(figsize=(6.4, 0.6 * len(ranked) + 1.6))
    for i, (axis, ratios) in enumerate(ranked):
        ax.barh(i, ratios[len(ratios) // 2] - 1, left=1, color="tab:blue", alpha=0.7)
        ax.plot(ratios, [i] * len(ratios), "k|", markersize=12)
    ax.set_yticks(range(len(ranked)), [a for a, _ in ranked])
    ax.set_xlabel("max/min latency over the axis, others at base\n(bar: median over workloads; ticks: each workload)")
    ax.set_title(f"{spec.name}: which hardware levers move the result")
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, path)


def _save(fig, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def plot_all(df, spec, directory: str) -> list:
    """Every plot of the sweep as ``DIR/<spec>_<what>.png`` -> their paths."""
    os.makedirs(directory, exist_ok=True)
    # NOTE: every name is made of safe characters, so no plot leaves ``directory``.
    base = os.path.join(directory, _file(spec.name))
    out = [axis_plot(df, spec, a, f"{base}_{_file(a.name)}.png") for a in spec.axes if len(a.values) > 1]
    multi = [a for a in spec.axes if len(a.values) > 1]
    # NOTE: a heatmap needs two axes crossed; one at a time, all but its base row and column are empty.
    if len(multi) >= 2 and spec.combine == "product":
        wl = df["workload"].iloc[0]
        out.append(heatmap(df, spec, multi[0], multi[1], wl, f"{base}_heatmap.png"))
    if multi:
        out.append(sensitivity_plot(df, spec, f"{base}_sensitivity.png"))
    else:
        out.append(points_plot(df, spec, f"{base}_points.png"))
    return out


def points_plot(df, spec, path: str) -> str:
    """Without axes: every point's latency, labelled by its workload and swept params."""
    plt = _plt()
    ok = df[df["error"].isna()]
    swept = list(dict.fromkeys(n for w in spec.workloads for n, _ in w.swept))
    labels = [" ".join([str(r["workload"])] + [f"{n}={r[n]}" for n in swept if n in r and r[n] == r[n]])
              for _, r in ok.iterrows()]
    fig, ax = plt.subplots(figsize=(7.2, 0.32 * len(ok) + 1.4))
    ax.barh(range(len(ok)), ok["latency_ns"], color="tab:blue", alpha=0.7)
    ax.set_yticks(range(len(ok)), labels, fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel("latency (ns)")
    ax.set_title(f"{spec.name}: latency per point")
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, path)


def _file(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
