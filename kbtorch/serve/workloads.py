"""Serving workloads: requests with arrival times and token lengths, synthetic or read from a trace.

Arrivals (``arrivals``): ``poisson`` (exponential gaps), ``gamma`` (gaps of shape
``burstiness`` and scale ``1 / (qps * burstiness)``, as vLLM's ``benchmark_serving``: a
burstiness of 1 is Poisson, below 1 burstier), ``constant`` (gaps of exactly ``1 / qps``); the
first request arrives at 0 s, as vLLM's benchmark sends its first at once. Closed-loop
concurrency is a property of the :class:`Workload` (``concurrency``): the serving loop keeps
that many requests outstanding and the arrival times are then ignored.

Lengths (``lengths``): ``fixed``, ``uniform`` (inclusive bounds) and ``zipf`` (a Zipf law of
exponent ``a`` over ``low..high``, rank 1 = ``low``). Every draw comes from
``numpy.random.default_rng(seed)``: a seed gives the same requests on any machine.

Traces: the Azure LLM inference trace 2023 (``azure``: ``TIMESTAMP,ContextTokens,GeneratedTokens``,
shipped in ``kbtorch/serve/data``), Mooncake JSONL (``timestamp`` in ms, ``input_length``,
``output_length``, ``hash_ids``: one id per 512-token block of the prompt) and a plain CSV or
JSONL of ``arrival_s, input_tokens, output_tokens`` (optional ``hash_ids``). A bad file is
refused with :class:`TraceError`, naming the file, the line and the column.
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, replace
from datetime import datetime
from importlib import resources

import numpy as np

#: Tokens one Mooncake ``hash_ids`` entry covers (the trace's block size).
MOONCAKE_HASH_TOKENS = 512
#: The shipped traces, by name (``kbtorch/serve/data``).
SHIPPED = {"azure-conv": "AzureLLMInferenceTrace_conv.csv", "azure-code": "AzureLLMInferenceTrace_code.csv"}


class TraceError(ValueError):
    """A trace file that cannot be read: the message names the file, line and column."""

    def __init__(self, path: str, line: int, column: str, problem: str):
        super().__init__(f"{path}:{line}: column '{column}': {problem}")


@dataclass(frozen=True)
class Request:
    """One request: ``hash_ids`` name the prompt's blocks of ``hash_tokens`` tokens for prefix
    caching (equal ids, equal prefix up to that block); none: the prompt shares nothing."""

    id: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple = ()
    hash_tokens: int = MOONCAKE_HASH_TOKENS


@dataclass(frozen=True)
class Workload:
    """Requests in arrival order; ``concurrency``: closed loop, that many outstanding at once."""

    requests: tuple
    concurrency: int | None = None

    def __post_init__(self):
        if not self.requests:
            raise ValueError("workload: no requests")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"workload: concurrency must be positive, got {self.concurrency}")
        times = [r.arrival_s for r in self.requests]
        if any(b < a for a, b in zip(times, times[1:])):
            raise ValueError("workload: requests must be in arrival order")


def arrivals(kind: str, n: int, qps: float, seed: int = 0, burstiness: float = 1.0) -> np.ndarray:
    """``n`` arrival times (s) of ``kind`` (poisson, gamma, constant) at ``qps`` requests/s."""
    if n < 1 or not qps > 0 or not math.isfinite(qps):
        raise ValueError(f"arrivals: need n >= 1 and a finite qps > 0, got n={n}, qps={qps}")
    rng = np.random.default_rng(seed)
    if kind == "poisson":
        gaps = rng.exponential(1.0 / qps, n - 1)
    elif kind == "gamma":
        if not burstiness > 0:
            raise ValueError(f"arrivals: burstiness must be > 0, got {burstiness}")
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (qps * burstiness), size=n - 1)
    elif kind == "constant":
        gaps = np.full(n - 1, 1.0 / qps)
    else:
        raise ValueError(f"arrivals: unknown kind '{kind}' (poisson, gamma, constant)")
    return np.concatenate(([0.0], np.cumsum(gaps)))


def lengths(kind: str, n: int, seed: int = 0, value: int = 0, low: int = 1, high: int = 1,
            a: float = 1.1) -> np.ndarray:
    """``n`` token counts: ``fixed`` (``value``), ``uniform`` (``low..high``), ``zipf`` (exponent ``a``)."""
    rng = np.random.default_rng(seed)
    if kind == "fixed":
        if value < 1:
            raise ValueError(f"lengths: fixed value must be positive, got {value}")
        return np.full(n, value, dtype=np.int64)
    if not 1 <= low <= high:
        raise ValueError(f"lengths: need 1 <= low <= high, got low={low}, high={high}")
    if kind == "uniform":
        return rng.integers(low, high + 1, n)
    if kind == "zipf":
        if not a > 0:
            raise ValueError(f"lengths: zipf exponent must be > 0, got {a}")
        ranks = np.arange(1, high - low + 2, dtype=float)
        p = ranks ** -a
        return low + rng.choice(len(ranks), size=n, p=p / p.sum())
    raise ValueError(f"lengths: unknown kind '{kind}' (fixed, uniform, zipf)")


def synthetic(n: int, qps: float, input_tokens, output_tokens, arrival: str = "poisson", seed: int = 0,
              burstiness: float = 1.0, concurrency: int | None = None) -> Workload:
    """A workload of ``n`` requests: ``input_tokens`` / ``output_tokens`` are an int (fixed) or
    a dict of :func:`lengths` arguments (``{"kind": "uniform", "low": 64, "high": 512}``).
    NOTE: arrivals, inputs and outputs draw from seeds ``seed``, ``seed + 1``, ``seed + 2``, so
    changing one distribution leaves the others as they were."""
    times = arrivals(arrival, n, qps, seed, burstiness)

    def draw(spec, offset):
        spec = {"kind": "fixed", "value": spec} if isinstance(spec, int) else dict(spec)
        return lengths(spec.pop("kind"), n, seed + offset, **spec)
    ins, outs = draw(input_tokens, 1), draw(output_tokens, 2)
    return Workload(tuple(Request(i, float(t), int(a), int(b)) for i, (t, a, b) in enumerate(zip(times, ins, outs))),
                    concurrency)


def rescale(workload: Workload, qps: float | None = None, time_scale: float | None = None,
            limit: int | None = None) -> Workload:
    """The first ``limit`` requests, arrival times shifted to start at 0 and multiplied by
    ``time_scale``, or scaled to a mean rate of ``qps`` ((n - 1) / span)."""
    reqs = workload.requests[:limit] if limit else workload.requests
    if qps is not None and time_scale is not None:
        raise ValueError("rescale: give qps or time_scale, not both")
    start, span = reqs[0].arrival_s, reqs[-1].arrival_s - reqs[0].arrival_s
    if qps is not None:
        if not qps > 0 or len(reqs) < 2 or span <= 0:
            raise ValueError(f"rescale: qps {qps} needs qps > 0 and at least two requests over a positive span")
        time_scale = (len(reqs) - 1) / span / qps
    scale = 1.0 if time_scale is None else time_scale
    if not scale > 0:
        raise ValueError(f"rescale: time_scale must be > 0, got {scale}")
    return Workload(tuple(replace(r, arrival_s=(r.arrival_s - start) * scale) for r in reqs), workload.concurrency)


def _count(path: str, line: int, column: str, value, minimum: int = 1) -> int:
    try:
        n = int(value)
        if isinstance(value, float) and n != value or isinstance(value, bool):
            raise ValueError
    except (TypeError, ValueError):
        raise TraceError(path, line, column, f"expected an integer, got {value!r}") from None
    if n < minimum:
        raise TraceError(path, line, column, f"must be >= {minimum}, got {n}")
    return n


def _seconds(path: str, line: int, column: str, value) -> float:
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise TraceError(path, line, column, f"expected a number of seconds, got {value!r}") from None
    if not math.isfinite(t) or t < 0:
        raise TraceError(path, line, column, f"must be a finite time >= 0, got {value!r}")
    return t


def _timestamp(path: str, line: int, column: str, text: str) -> float:
    """Seconds since the epoch of an Azure ``YYYY-MM-DD HH:MM:SS.fffffff`` (any digits of fraction)."""
    whole, _, frac = (text or "").strip().partition(".")
    try:
        if frac and not frac.isdigit():
            raise ValueError
        return datetime.fromisoformat(whole).timestamp() + (float("0." + frac) if frac else 0.0)
    except ValueError:
        raise TraceError(path, line, column, f"expected 'YYYY-MM-DD HH:MM:SS.fff', got {text!r}") from None


def _hash_ids(path: str, line: int, value) -> tuple:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in value):
        raise TraceError(path, line, "hash_ids", f"expected a list of integers, got {value!r}")
    return tuple(value)


def _ordered(path: str, rows: list, column: str) -> Workload:
    """rows of (line, arrival_s, input, output, hash_ids) -> a Workload starting at 0 s."""
    for (line_a, a, *_), (line_b, b, *_) in zip(rows, rows[1:]):
        if b < a:
            raise TraceError(path, line_b, column, f"times must not decrease: {b!r} after {a!r} on line {line_a}")
    if not rows:
        raise TraceError(path, 1, column, "the trace has no requests")
    start = rows[0][1]
    return Workload(tuple(Request(i, t - start, a, b, h) for i, (_, t, a, b, h) in enumerate(rows)))


def _csv_rows(path: str, text: str, columns: tuple) -> list:
    """(line number, row dict) of a CSV with exactly ``columns`` (any order) in its header."""
    reader = csv.DictReader(text.splitlines())
    header = reader.fieldnames or []
    missing = [c for c in columns if c not in header]
    extra = [c for c in header if c not in columns and c != "hash_ids"]
    if missing or extra:
        bad = (missing or extra)[0]
        raise TraceError(path, 1, bad, f"{'missing' if missing else 'unexpected'} column; the header must be "
                                       f"{','.join(columns)}, got {','.join(header)}")
    out = []
    for row in reader:
        if None in row or any(row[c] is None for c in columns):
            raise TraceError(path, reader.line_num, columns[-1], f"expected {len(header)} fields")
        out.append((reader.line_num, row))
    return out


def _read(path) -> tuple:
    """(name for messages, text) of a path or a shipped trace name."""
    if str(path) in SHIPPED:
        return str(path), resources.files("kbtorch.serve").joinpath("data", SHIPPED[str(path)]).read_text()
    try:
        with open(path, encoding="utf-8-sig") as fh:
            return str(path), fh.read()
    except OSError as exc:
        raise ValueError(f"trace '{path}': cannot read it: {exc.strerror}") from None


def azure(path="azure-conv") -> Workload:
    """The Azure LLM inference trace 2023 (a path, or ``azure-conv`` / ``azure-code`` shipped)."""
    name, text = _read(path)
    cols = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    rows = [(n, _timestamp(name, n, cols[0], r[cols[0]]), _count(name, n, cols[1], r[cols[1]]),
             _count(name, n, cols[2], r[cols[2]]), ()) for n, r in _csv_rows(name, text.lstrip("\ufeff"), cols)]
    return _ordered(name, rows, cols[0])


def _jsonl(name: str, text: str, keys: tuple, scale_s: float) -> list:
    rows = []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TraceError(name, n, "-", f"not JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise TraceError(name, n, "-", "expected a JSON object")
        for k in keys:
            if k not in obj:
                raise TraceError(name, n, k, "missing field")
        rows.append((n, _seconds(name, n, keys[0], obj[keys[0]]) * scale_s, _count(name, n, keys[1], obj[keys[1]]),
                     _count(name, n, keys[2], obj[keys[2]]), _hash_ids(name, n, obj.get("hash_ids"))))
    return rows


def mooncake(path) -> Workload:
    """A Mooncake trace (JSONL; ``timestamp`` in ms)."""
    name, text = _read(path)
    return _ordered(name, _jsonl(name, text, ("timestamp", "input_length", "output_length"), 1e-3), "timestamp")


def plain(path) -> Workload:
    """A CSV or JSONL (by its suffix ``.csv``) of ``arrival_s, input_tokens, output_tokens``."""
    name, text = _read(path)
    cols = ("arrival_s", "input_tokens", "output_tokens")
    if name.endswith(".csv"):
        rows = [(n, _seconds(name, n, cols[0], r[cols[0]]), _count(name, n, cols[1], r[cols[1]]),
                 _count(name, n, cols[2], r[cols[2]]), ()) for n, r in _csv_rows(name, text, cols)]
    else:
        rows = _jsonl(name, text, cols, 1.0)
    return _ordered(name, rows, cols[0])


READERS = {"azure": azure, "mooncake": mooncake, "plain": plain}


def trace(path, kind: str | None = None) -> Workload:
    """Read a trace of ``kind`` (azure, mooncake, plain; default: a shipped name is azure, a
    ``.jsonl`` with ``timestamp`` fields mooncake, else plain)."""
    if kind is None:
        kind = "azure" if str(path) in SHIPPED else "plain"
        if kind == "plain" and str(path).endswith(".jsonl"):
            first = next((ln for ln in _read(path)[1].splitlines() if ln.strip()), "")
            kind = "mooncake" if '"timestamp"' in first else "plain"
    if kind not in READERS:
        raise ValueError(f"trace: unknown kind '{kind}' ({', '.join(READERS)})")
    return READERS[kind](path)
