"""Plots of serving runs (matplotlib, the ``[sweep]`` extra; Agg backend, PNG): latency against
request rate, and a run's KV utilisation and queue over time.

    serve.plot_latency_qps({"TP 8": cap8.trials, "2 x TP 4": cap4.trials}, "qps.png", slos)
    serve.plot_timeline(result, "kv.png")
"""
from __future__ import annotations

from .metrics import parse_slo

__all__ = ["plot_latency_qps", "plot_timeline", "pyplot"]
#: The panels' order.
ORDER = ("ttft", "tpot", "e2el")


def pyplot():
    """matplotlib.pyplot on the Agg backend, or an ImportError naming the extra to install."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("serving plots need matplotlib: pip install 'kbtorch[sweep]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_latency_qps(curves: dict, path: str, slos: dict | None = None) -> str:
    """One panel per SLO metric (P99 TTFT, P99 TPOT, ...): its P99 against the rate for each
    curve (``{label: trials}``, the ``Trial``s of ``find_capacity``, or ``(qps, {name: p99
    ms})`` pairs), the SLO's limit dashed, a failed trial hollow. -> ``path``."""
    series = {label: sorted((_pair(t) for t in trials), key=lambda p: p[0]) for label, trials in curves.items()}
    found = {n for pts in series.values() for _, p99, _ in pts for n in p99}
    names = [n for n in ORDER if n in found] + sorted(found - set(ORDER))
    if not names:
        raise ValueError("plot_latency_qps: no P99 figures to plot (give trials of a search with SLOs)")
    plt = pyplot()
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names):
        for label, pts in series.items():
            xs = [q for q, p99, _ in pts if p99.get(name) is not None]
            ys = [p99[name] for _, p99, _ in pts if p99.get(name) is not None]
            line, = ax.plot(xs, ys, "-", label=label)
            for q, p99, met in pts:
                if p99.get(name) is not None:
                    ax.plot(q, p99[name], "o", color=line.get_color(), fillstyle="full" if met else "none")
        if slos and name in slos:
            ax.axhline(parse_slo(name, slos[name]), color="grey", linestyle="--", label=f"SLO {slos[name]}")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(f"P99 {name.upper()} (ms)")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    return _saved(plt, fig, path)


def _pair(t) -> tuple:
    if hasattr(t, "qps"):
        return t.qps, dict(t.p99_ms), t.met
    qps, p99 = t
    return qps, dict(p99), True


def plot_timeline(result, path: str) -> str:
    """A run's KV cache share held and its waiting requests over time, per replica (from
    ``ServeResult.timeline``). -> ``path``."""
    line = result.timeline()
    if not line:
        raise ValueError("plot_timeline: the run has no steps")
    plt = pyplot()
    fig, (kv, queue) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    for replica in sorted({r for _, r, _, _ in line}):
        pts = [(t, share, waiting) for t, r, share, waiting in line if r == replica]
        kv.plot([p[0] for p in pts], [100 * p[1] for p in pts], lw=0.8, label=f"replica {replica}")
        queue.plot([p[0] for p in pts], [p[2] for p in pts], lw=0.8, label=f"replica {replica}")
    kv.set_ylabel("KV blocks held (%)")
    kv.set_ylim(0, 100)
    queue.set_ylabel("waiting requests")
    queue.set_ylim(bottom=0)
    queue.set_xlabel("time (s)")
    kv.legend(fontsize=8)
    return _saved(plt, fig, path)


def _saved(plt, fig, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
