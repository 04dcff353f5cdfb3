"""Serving metrics, defined as vLLM's ``benchmark_serving`` defines them, and an MLPerf server P99.

Per finished request: TTFT (first token - arrival), E2E (last token - arrival), TPOT =
(E2E - TTFT) / (output - 1) for outputs of more than one token (0 for one token, where goodput
reads it, as vLLM), ITL: the gaps between successive tokens, pooled over all requests.
Throughput over the duration (the last measured finish - the first measured arrival):
requests, output tokens and input + output tokens per second; goodput: the requests meeting
every SLO given (``ttft``, ``tpot``, ``e2el``, each with a unit: ``"200ms"``, ``"2s"``) per
second. Percentiles are numpy's linear interpolation (``np.percentile``); the MLPerf P99 is the
sorted value at index ``floor(0.99 n)`` (at most the last), as the LoadGen takes it.

The first ``warmup`` and last ``drain`` shares of the requests (by arrival) are reported apart
and left out of every figure. The run is labelled:

- ``overloaded``: the queueing wait grows through the run: the mean wait of the last half of the
  measured requests exceeds the first half's by more than 5% of half the arrival span (waits
  grow as (1 - 1/rho) t under a load rho > 1: this is rho above about 1.05);
- ``backlogged``: otherwise, if the mean wait is longer than the mean time in service (a
  standing queue);
- ``stable``: otherwise.
"""
from __future__ import annotations

import csv
import math
import re

import numpy as np

PERCENTILES = (50, 90, 99)
SLO_KEYS = ("ttft", "tpot", "e2el")
_FIELD = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2e_s"}
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def parse_slo(name: str, value) -> float:
    """An SLO in ms from text with a unit (``"200ms"``, ``"2s"``, ``"500us"``); a bare number is refused."""
    if name not in SLO_KEYS:
        raise ValueError(f"SLO '{name}': unknown (choose from {', '.join(SLO_KEYS)})")
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(us|ms|s)\s*", str(value))
    if not m:
        raise ValueError(f"SLO '{name}': '{value}' needs a unit (e.g. 200ms, 2s, 500us)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _stats(name: str, values_s: list) -> dict:
    ms = np.asarray(values_s, dtype=float) * 1e3
    if ms.size == 0:
        return {f"{k}_{name}_ms": None for k in ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES))}
    out = {f"mean_{name}_ms": float(ms.mean()), f"median_{name}_ms": float(np.median(ms)), f"std_{name}_ms": float(ms.std())}
    out.update({f"p{p}_{name}_ms": float(np.percentile(ms, p)) for p in PERCENTILES})
    return out


def mlperf_p99(values: list) -> float | None:
    """The MLPerf LoadGen percentile: the sorted value at index floor(0.99 n), at most n - 1."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.floor(0.99 * len(ordered)))]


def per_request(r) -> dict:
    """TTFT, TPOT, E2E (s) and queue wait of a finished request record."""
    ttft, e2e = r.token_s[0] - r.arrival_s, r.token_s[-1] - r.arrival_s
    n = len(r.token_s)
    return {"ttft_s": ttft, "e2e_s": e2e, "tpot_s": (e2e - ttft) / (n - 1) if n > 1 else 0.0,
            "wait_s": r.first_scheduled_s - r.arrival_s, "itl_s": [b - a for a, b in zip(r.token_s, r.token_s[1:])]}


def split(records: tuple, warmup: float, drain: float) -> tuple:
    """(warm-up, measured, drain) records, by arrival order."""
    if not (0 <= warmup < 1 and 0 <= drain < 1 and warmup + drain < 1):
        raise ValueError(f"metrics: warmup {warmup} and drain {drain} must be shares in [0, 1) summing below 1")
    ordered = sorted(records, key=lambda r: (r.arrival_s, r.id))
    a, b = math.floor(warmup * len(ordered)), len(ordered) - math.floor(drain * len(ordered))
    return ordered[:a], ordered[a:b], ordered[b:]


def label(measured: list, rows: list) -> str:
    """stable / backlogged / overloaded (module docstring) of the measured finished requests."""
    if len(rows) < 4:
        return "stable"
    half = len(rows) // 2
    w1 = float(np.mean([x["wait_s"] for x in rows[:half]]))
    w2 = float(np.mean([x["wait_s"] for x in rows[half:]]))
    span = measured[-1].arrival_s - measured[0].arrival_s
    if span > 0 and w2 - w1 > 0.05 * span / 2:
        return "overloaded"
    wait = float(np.mean([x["wait_s"] for x in rows]))
    service = float(np.mean([x["e2e_s"] - x["wait_s"] for x in rows]))
    return "backlogged" if wait > service else "stable"


def compute(records: tuple, slos: dict | None = None, warmup: float = 0.1, drain: float = 0.1) -> dict:
    """Every figure of a run (module docstring) as one flat dict."""
    slo_ms = {k: parse_slo(k, v) for k, v in (slos or {}).items()}
    warm, measured, tail = split(records, warmup, drain)
    done = [r for r in measured if r.status == "finished"]
    rows = [per_request(r) for r in done]
    start = min((r.arrival_s for r in measured), default=0.0)
    end = max((r.token_s[-1] for r in done), default=start)
    dur = end - start
    ins, outs = sum(r.input_tokens for r in done), sum(len(r.token_s) for r in done)
    good = sum(all(x[_FIELD[k]] * 1e3 <= ms for k, ms in slo_ms.items()) for x in rows)
    out = {"completed": len(done), "refused": sum(r.status == "refused" for r in measured), "warmup_requests": len(warm),
           "drain_requests": len(tail), "duration_s": dur, "total_input_tokens": ins, "total_output_tokens": outs,
           "request_throughput": len(done) / dur if dur > 0 else None,
           "request_goodput": good / dur if dur > 0 and slo_ms else None,
           "output_throughput": outs / dur if dur > 0 else None,
           "total_token_throughput": (ins + outs) / dur if dur > 0 else None,
           "preemptions": sum(r.preemptions for r in done), "cached_tokens": sum(r.cached_tokens for r in done),
           "mean_wait_s": float(np.mean([x["wait_s"] for x in rows])) if rows else None,
           "slos_ms": slo_ms, "label": label(measured, rows)}
    out.update(_stats("ttft", [x["ttft_s"] for x in rows]))
    out.update(_stats("tpot", [x["tpot_s"] for x in rows if x["itl_s"]]))
    out.update(_stats("itl", [g for x in rows for g in x["itl_s"]]))
    out.update(_stats("e2el", [x["e2e_s"] for x in rows]))
    for k in ("ttft", "tpot"):
        p99 = mlperf_p99([x[f"{k}_s"] for x in rows if k == "ttft" or x["itl_s"]])
        out[f"mlperf_p99_{k}_ms"] = None if p99 is None else p99 * 1e3
    return out


CSV_COLUMNS = ("id", "replica", "status", "reason", "arrival_s", "input_tokens", "output_tokens", "first_scheduled_s",
               "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "preemptions", "cached_tokens", "phase")


def write_csv(path: str, records: tuple, warmup: float = 0.1, drain: float = 0.1) -> None:
    """One row per request (``CSV_COLUMNS``); ``phase``: warmup, measured or drain."""
    warm, measured, tail = split(records, warmup, drain)
    phase = {**{r.id: "warmup" for r in warm}, **{r.id: "measured" for r in measured}, **{r.id: "drain" for r in tail}}
    try:
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(CSV_COLUMNS)
            for r in records:
                x = per_request(r) if r.status == "finished" else {}
                w.writerow([r.id, r.replica, r.status, r.reason, r.arrival_s, r.input_tokens, r.output_tokens,
                            r.first_scheduled_s, r.token_s[0] if r.token_s else None,
                            r.token_s[-1] if r.token_s else None, x.get("ttft_s"), x.get("tpot_s"), x.get("e2e_s"),
                            r.preemptions, r.cached_tokens, phase[r.id]])
    except OSError as exc:
        raise ValueError(f"per-request CSV '{path}': cannot write it: {exc.strerror}") from None
