"""Capacity search: the highest request rate a setup serves within its SLOs.

A run at ``qps`` *meets* the SLOs when it is ``stable`` (``metrics.label``: no growing or
standing queue), refuses no request, and the P99 of each metric an SLO names is within its
limit: TTFT and TPOT by the MLPerf LoadGen's floor index (``mlperf_p99``), E2E by numpy's
interpolated P99. The search doubles (or halves) the rate from ``qps`` until one run meets and
one does not, then bisects until they are within ``tolerance`` of each other; every run is
kept with why it passed or failed. NOTE: it assumes a setup that meets the SLOs at a rate
meets them at any lower one (the search never looks below a rate that met).
"""
from __future__ import annotations

from dataclasses import dataclass

from .metrics import parse_slo

#: The P99 each SLO is checked against (``metrics.compute``'s fields).
P99_FIELD = {"ttft": "mlperf_p99_ttft_ms", "tpot": "mlperf_p99_tpot_ms", "e2el": "p99_e2el_ms"}


@dataclass(frozen=True)
class Trial:
    """One run of the search: its rate, whether it met the SLOs, why not, and its P99s (ms)."""

    qps: float
    met: bool
    why: str
    label: str
    p99_ms: dict


@dataclass(frozen=True)
class Capacity:
    """The highest rate that met the SLOs (None: even the lowest tried did not), the lowest
    that did not (None: none failed within ``max_runs``), every trial in order, and the run
    at ``qps`` (a ``ServeResult``)."""

    qps: float | None
    failed_qps: float | None
    trials: tuple
    best: object = None

    def to_json(self) -> dict:
        return {"capacity_qps": self.qps, "first_failing_qps": self.failed_qps,
                "trials": [{"qps": t.qps, "met": t.met, "why": t.why, "label": t.label, "p99_ms": t.p99_ms}
                           for t in self.trials],
                "best": self.best.to_json() if self.best is not None else None}


def verdict(metrics: dict, slos: dict) -> tuple[bool, str]:
    """(met, why not) of a run's metrics against ``slos`` (module docstring)."""
    if metrics["label"] != "stable":
        return False, f"the run is {metrics['label']}"
    if metrics["refused"]:
        return False, f"{metrics['refused']} requests refused"
    for name, value in slos.items():
        limit, got = parse_slo(name, value), metrics[P99_FIELD[name]]
        if got is None or got > limit:
            return False, f"P99 {name} {got if got is None else round(got, 3)} ms > {limit:g} ms"
    return True, ""


def search(serve_at, slos: dict, qps: float = 1.0, tolerance: float = 0.02, max_runs: int = 24) -> Capacity:
    """The capacity of ``serve_at(qps) -> ServeResult`` within ``slos`` (at least one SLO;
    ``{"ttft": "2s", "tpot": "200ms"}``), starting from ``qps``."""
    if not slos:
        raise ValueError("capacity: give at least one SLO (ttft, tpot, e2el)")
    for name, value in slos.items():
        parse_slo(name, value)
    if not qps > 0 or not 0 < tolerance < 1 or max_runs < 2:
        raise ValueError(f"capacity: qps {qps} must be > 0, tolerance {tolerance} in (0, 1), max_runs {max_runs} >= 2")
    trials, results = [], {}

    def run(q: float) -> bool:
        result = serve_at(q)
        met, why = verdict(result.metrics, slos)
        trials.append(Trial(q, met, why, result.metrics["label"],
                            {k: result.metrics[P99_FIELD[k]] for k in slos}))
        results[q] = result
        return met

    good, bad = (qps, None) if run(qps) else (None, qps)
    while (good is None or bad is None) and len(trials) < max_runs:
        q = good * 2 if bad is None else bad / 2
        if run(q):
            good = q
        else:
            bad = q
    while good is not None and bad is not None and bad / good - 1 > tolerance and len(trials) < max_runs:
        q = (good + bad) / 2
        if run(q):
            good = q
        else:
            bad = q
    return Capacity(good, bad, tuple(trials), results.get(good))
