"""Human-readable latency reports: attribution by component kind and the hops of a route.

Kinds are the ``kind`` attributes of the topology's nodes and links (plus ``issue``, the
control processor's command-issue cost; friendly names in ``kbtorch.topology.kinds``); times
are reported in ns. ``profile()`` listens to the ahbm device's stream
(``kbtorch.tensor.stream``): a table per op name, a Chrome/Perfetto trace.
"""
from __future__ import annotations

import json
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from tabulate import tabulate

from .kernel import use_fidelity
from .ops.contract import tflops
from .tensor.stream import listen
from .topology.kinds import kind_name


def breakdown_ns(result) -> dict[str, float]:
    """``{kind: ns}`` of a run's latency, largest first."""
    items = sorted(result.breakdown().items(), key=lambda kv: (-kv[1], kv[0]))
    return {k: ps / 1000 for k, ps in items}


def breakdown_table(result, top: int | None = None) -> str:
    """Latency attribution of a run by component kind (ns and % of the latency), largest
    first; with ``top``, the rest is summed into one ``other`` row."""
    total = result.latency_ps / 1000
    items = list(breakdown_ns(result).items())
    if top is not None and len(items) > top:
        items = items[:top] + [("other", sum(ns for _, ns in items[top:]))]
    rows = [(kind_name(k), k, ns, 100 * ns / total if total else 0.0) for k, ns in items]
    rows.append(("total", "", total, 100.0 if total else 0.0))
    return tabulate(rows, headers=("component", "kind", "ns", "%"), floatfmt=("", "", ".3f", ".1f"))


def path_table(path, machine) -> str:
    """The hops of a route (a sequence of node names): each node with the link that enters it
    (kind, GB/s, propagation ns) and its switching overhead (ns)."""
    g = machine.graph
    rows = []
    for i, node in enumerate(path):
        d = g.nodes[node]
        if i == 0:
            link = ("", "", "")
        else:
            e = g.edges[path[i - 1], node]
            link = (e["kind"], f"{e['bw_gbps']:g}", f"{e['prop_ns']:g}")
        rows.append((i, node, d["kind"], *link, f"{d['overhead_ns']:g}"))
    return tabulate(rows, headers=("hop", "node", "kind", "link in", "GB/s", "prop ns", "switch ns"),
                    disable_numparse=True)


class Profile:
    """The ops recorded while a ``profile()`` block was open (``records``, in order)."""

    def __init__(self):
        self.records: list = []

    @property
    def total_ns(self) -> float:
        """The ops' latencies summed (with pipeline stages, their busy time added up)."""
        return sum(r.latency_ns for r in self.records)

    @property
    def span_ns(self) -> float:
        """From the first op's start to the last op's end: the elapsed time, also when ops
        of pipeline stages overlap (one stream: ``total_ns``)."""
        if not self.records:
            return 0.0
        return max(r.start_ns + r.latency_ns for r in self.records) - min(r.start_ns for r in self.records)

    @property
    def model_ns(self) -> float:
        """The latency of the ops a module's call ran (``OpRecord.module``): the model's work."""
        return sum(r.latency_ns for r in self.records if r.module)

    @property
    def host_ns(self) -> float:
        """The latency of the ops host code ran outside any module's call (generate()'s
        bookkeeping, a script's own tensor ops): ``total_ns - model_ns``."""
        return sum(r.latency_ns for r in self.records if not r.module)

    def obtained(self) -> dict:
        """How the recorded ops' figures were obtained (``kernel.steady.Obtained``): the ops by
        method (``simulated``: every event; ``fast-forward``; graph mode's ``periodic`` and
        ``retimed``; ``none``: no run behind it) and by fidelity, and over the distinct runs
        behind them (an op repeated from a memoized run, a layer of 28, counts once) the
        events simulated and skipped and the largest error bound claimed, relative to a run's
        latency."""
        methods, fidelities, runs = {}, {}, {}
        for r in self.records:
            o = r.obtained
            method = o.method if o is not None else "none"
            methods[method] = methods.get(method, 0) + 1
            if o is not None:
                fidelities[o.fidelity] = fidelities.get(o.fidelity, 0) + 1
                runs[id(o)] = o
        return {"ops_by_method": methods, "ops_by_fidelity": fidelities, "runs": len(runs),
                "events_simulated": sum(o.events_simulated for o in runs.values()),
                "events_skipped": sum(o.events_skipped for o in runs.values()),
                "error_bound": max((o.error_bound for o in runs.values()), default=0.0)}

    def key_averages(self) -> "KeyAverages":
        return KeyAverages(self.records)

    def export_chrome_trace(self, path: str) -> None:
        """Chrome/Perfetto JSON: every op on its kernel's track (a pipeline stage's ops on
        their stage's track); on one track per engine role
        and per link kind an event over the op's span named with how busy it was (engines:
        mean over the PEs used; links: the busiest link of the kind); and on one track per
        engine of the op's first PE, its commands as they ran (busy spans, up to
        ``SPANS_MAX`` per engine and op), so the overlap of the engines shows."""
        tracks: dict = {}
        events = []
        for r in self.records:
            base = {"ph": "X", "pid": 1, "ts": r.start_ns / 1000, "dur": r.latency_ns / 1000}
            events.append(dict(base, name=r.name, cat=r.kernel, tid=tracks.setdefault(r.track or r.kernel, len(tracks) + 1),
                               args={"shapes": [list(s) for s in r.shapes], "bottleneck": r.bottleneck,
                                     "flops": r.flops, "bytes": r.bytes, "detail": r.detail}))
            for track, busy in r.usage:
                events.append(dict(base, name=f"{r.name} {100 * busy:.0f}%", cat="usage",
                                   tid=tracks.setdefault(track, len(tracks) + 1), args={"busy": busy}))
            events += _command_events(r, tracks) + _part_events(r, tracks)
        events += [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": name}}
                   for name, tid in tracks.items()]
        with open(path, "w") as fh:
            json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, fh)


def _part_events(r, tracks: dict) -> list:
    """A graph's kernels, each on the first graph lane free over its span (concurrent
    kernels on their own tracks), with its PEs."""
    lanes, out = [], []
    for p in sorted(r.parts, key=lambda p: (p.start_ns, p.name)):
        lane = next((i for i, end in enumerate(lanes) if end <= p.start_ns), len(lanes))
        lanes[lane:lane + 1] = [p.start_ns + p.latency_ns]
        out.append({"ph": "X", "pid": 1, "tid": tracks.setdefault(f"graph lane {lane}", len(tracks) + 1),
                    "ts": (r.start_ns + p.start_ns) / 1000, "dur": p.latency_ns / 1000, "name": p.name,
                    "cat": p.kernel, "args": {"shapes": [list(s) for s in p.shapes], "detail": p.detail,
                                              "flops": p.flops}})
    return out


def _command_events(r, tracks: dict) -> list:
    """The busy spans of the op's first PE's engines as events, offset by the op's start."""
    timeline = r.timeline or {}
    out = []
    for role, spans in timeline.items():
        if role == "pe":
            continue
        tid = tracks.setdefault(f"first PE: {role}", len(tracks) + 1)
        for start, end, what in spans:
            out.append({"ph": "X", "pid": 1, "tid": tid, "ts": (r.start_ns + start / 1000) / 1000,
                        "dur": (end - start) / 1e6, "name": what, "cat": "command", "args": {"op": r.name,
                                                                                            "pe": timeline["pe"]}})
    return out


@dataclass(frozen=True)
class OpAverage:
    """The ops of one name (``key``), in the manner of ``torch.profiler``'s ``FunctionEventAvg``:
    ``count`` calls, ``latency_ns`` in all (``device_time_total``: the same in us, as torch's)."""

    key: str
    count: int
    latency_ns: float
    avg_ns: float
    pct: float
    tflops: float
    gbps: float
    kernel: str
    bottleneck: str
    module: str = ""        # the outermost module class of these calls; "": host code (``Profile.host_ns``)

    @property
    def device_time_total(self) -> float:
        return self.latency_ns / 1000

    @property
    def device_time(self) -> float:
        return self.avg_ns / 1000


class KeyAverages(list):
    """The records grouped by op name, a list of ``OpAverage`` in order of first call, as
    ``torch.profiler``'s ``key_averages()``; ``table()`` prints it. Ops a module's call ran
    and ops of the host code around it (outside any module) are grouped apart, so an op
    name of both kinds has a row of each."""

    COLUMNS = ("key", "count", "latency_ns", "avg_ns", "pct", "tflops", "gbps", "kernel", "bottleneck")
    #: torch.profiler's sort keys, as the columns they are here (one device: total = self).
    ALIASES = {"name": "key", "calls": "count", "device_time_total": "latency_ns", "self_device_time_total": "latency_ns",
               "cuda_time_total": "latency_ns", "self_cuda_time_total": "latency_ns", "device_time": "avg_ns"}

    def __init__(self, records: list):
        groups: dict = {}
        for r in records:
            groups.setdefault((r.name, bool(r.module)), []).append(r)
        total = sum(r.latency_ns for r in records) or 1.0
        rows = []
        for (name, _), rs in groups.items():
            ns = sum(r.latency_ns for r in rs)
            rows.append(OpAverage(name, len(rs), ns, ns / len(rs), 100 * ns / total, tflops(sum(r.flops for r in rs), ns),
                                  sum(r.bytes for r in rs) / ns if ns else 0.0, rs[0].kernel, rs[-1].bottleneck,
                                  rs[0].module))
        super().__init__(rows)

    def table(self, sort_by: str = "latency_ns", row_limit: int = 100) -> str:
        """The rows sorted by ``sort_by`` (a column or a torch.profiler sort key), largest
        first, ``row_limit`` rows in all; where some ops ran in a module's call and some
        outside any, the host code's rows follow the model's in a table of their own, under
        its total."""
        column = self.ALIASES.get(sort_by, sort_by)
        if column not in self.COLUMNS:
            raise ValueError(f"sort_by '{sort_by}' is not a column ({', '.join(self.COLUMNS)}) or a torch.profiler "
                             f"sort key ({', '.join(self.ALIASES)})")
        rows = sorted(self, key=lambda r: getattr(r, column), reverse=column not in ("key", "kernel", "bottleneck"))
        host = [r for r in rows if not r.module]
        if len(host) in (0, len(rows)):
            return self._tabulate(rows[:row_limit])
        shown = rows[:row_limit]
        model, apart = [r for r in shown if r.module], [r for r in shown if not r.module]
        modules = ", ".join(dict.fromkeys(r.module for r in rows if r.module))
        text = f"in {modules} calls:\n{self._tabulate(model)}\n\nhost code outside any module: " \
               f"{sum(r.latency_ns for r in host) / 1000:.3f} us, {sum(r.pct for r in host):.1f}% of the recorded time"
        return text + (f"\n{self._tabulate(apart)}" if apart else "")

    def _tabulate(self, rows: list) -> str:
        return tabulate([[getattr(r, c) for c in self.COLUMNS] for r in rows], headers=("name", "calls", *self.COLUMNS[2:]),
                        floatfmt=".2f")


@contextmanager
def profile(fidelity: str | None = None):
    """Record every op on the ahbm device while the block runs, in this context only:
    ``with kbtorch.profile() as prof``; ``fidelity`` (``auto``, ``exact``; None: the one in
    force) holds for the block (``kernel.use_fidelity``)."""
    prof = Profile()
    with listen(prof.records), (use_fidelity(fidelity) if fidelity is not None else nullcontext()):
        yield prof
