"""Step models: the latency of one engine iteration, given its batch described per request.

A step model is any object with ``step_ns_of(batch) -> float`` and ``describe() -> dict``, ``batch`` a tuple of
:class:`~kbtorch.serve.scheduler.BatchEntry` (new tokens, context tokens, prefill or decode).
The loop adds the per-step host overhead itself (``EngineConfig.host_overhead_ns``): a step
model times the device's work only.

- :class:`ConstantStep`: every step takes ``step_ns`` (queueing checks: M/D/1).
- :class:`TableStep`: measured step times from a CSV with the columns ``new_tokens`` (the
  batch's tokens computed in the step, summed over its requests), ``context_tokens`` (the
  positions already in the KV cache that the step's tokens attend to, summed over its
  requests) and ``step_ns``. A lookup interpolates linearly in ``new_tokens`` along each measured
  ``context_tokens`` row, then linearly between the two rows around the query (beyond the
  first or last point: the line through the two end points, never below 0 ns).
- ``simulated`` (:mod:`kbtorch.serve.simulated`): from kbtorch's simulation of the model.
"""
from __future__ import annotations

import bisect
import csv
import math
from dataclasses import dataclass

from .workloads import TraceError


@dataclass(frozen=True)
class ConstantStep:
    step_ns: float

    def __post_init__(self):
        if not self.step_ns > 0 or not math.isfinite(self.step_ns):
            raise ValueError(f"constant step model: step_ns must be a finite number > 0, got {self.step_ns}")

    def step_ns_of(self, batch) -> float:
        return self.step_ns

    def describe(self) -> dict:
        return {"kind": "constant", "step_ns": self.step_ns}


@dataclass(frozen=True)
class LinkTransfer:
    """A KV transfer model given by the user (as :class:`ConstantStep` is for steps): ``latency_ns``
    plus the bytes at ``gbps`` (GB/s). The simulated one is ``SimulatedStep.transfer_ns``."""

    gbps: float
    latency_ns: float = 0.0

    def __post_init__(self):
        if not self.gbps > 0 or not math.isfinite(self.gbps) or not 0 <= self.latency_ns < math.inf:
            raise ValueError(f"link transfer: gbps must be a finite number > 0 and latency_ns >= 0, got "
                             f"{self.gbps}, {self.latency_ns}")

    def transfer_ns(self, nbytes: int) -> float:
        return self.latency_ns + nbytes / self.gbps

    def describe(self) -> dict:
        return {"kind": "link", "gbps": self.gbps, "latency_ns": self.latency_ns}


def batch_features(batch) -> tuple:
    """(tokens computed, context positions attended) of a batch, summed over its requests."""
    return sum(e.new_tokens for e in batch), sum(e.context_tokens for e in batch)


def _line(x: float, xs: list, ys: list) -> float:
    """Piecewise-linear ``ys(xs)`` at ``x``, extended beyond the ends by the end segments."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class TableStep:
    """Measured points: ``rows`` of (context_tokens, ((new_tokens, ...), (step_ns, ...))), sorted."""

    path: str
    rows: tuple

    @classmethod
    def read(cls, path: str) -> "TableStep":
        cols = ("new_tokens", "context_tokens", "step_ns")
        try:
            with open(path, newline="", encoding="utf-8-sig") as fh:
                lines = list(csv.DictReader(fh))
                header = list(lines[0].keys()) if lines else []
        except OSError as exc:
            raise ValueError(f"step table '{path}': cannot read it: {exc.strerror}") from None
        for c in cols:
            if c not in header:
                raise TraceError(path, 1, c, f"missing column; the header must hold {','.join(cols)}")
        points: dict = {}
        for n, row in enumerate(lines, 2):
            vals = []
            for c in cols:
                try:
                    v = float(row[c])
                except (TypeError, ValueError):
                    raise TraceError(path, n, c, f"expected a number, got {row[c]!r}") from None
                if not math.isfinite(v) or v < 0 or c == "step_ns" and v == 0:
                    raise TraceError(path, n, c, f"must be a finite number {'> 0' if c == 'step_ns' else '>= 0'}, got {v}")
                vals.append(v)
            tokens, context, ns = vals
            if (context, tokens) in points:
                raise TraceError(path, n, "new_tokens", f"a second point at new_tokens {tokens:g}, context_tokens {context:g}")
            points[(context, tokens)] = ns
        if not points:
            raise TraceError(path, 2, "step_ns", "the table has no rows")
        by_context: dict = {}
        for (context, tokens), ns in sorted(points.items()):
            by_context.setdefault(context, ([], []))
            by_context[context][0].append(tokens)
            by_context[context][1].append(ns)
        return cls(path, tuple((c, (tuple(t), tuple(y))) for c, (t, y) in sorted(by_context.items())))

    def lookup_ns(self, tokens: float, context: float) -> float:
        contexts = [c for c, _ in self.rows]
        at = [_line(tokens, list(ts), list(ys)) for _, (ts, ys) in self.rows]
        return max(0.0, _line(context, contexts, at))

    def step_ns_of(self, batch) -> float:
        return self.lookup_ns(*batch_features(batch))

    def describe(self) -> dict:
        return {"kind": "table", "path": self.path, "points": sum(len(ts) for _, (ts, _) in self.rows)}
