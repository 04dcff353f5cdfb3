"""Workloads of a sweep and how one point runs: a registered op family (``op = "gemm"``), the
Qwen2 decoder layer (``op = "qwen_layer"``) or any ``fn = "module:function"`` called as
``function(machine=..., **params)``; each returns an ``OpRun`` (or a dict with at least
``latency_ns``), turned into one row of figures by :func:`measure`.
"""
from __future__ import annotations

import importlib
import inspect
import itertools
import sys
import time
from dataclasses import dataclass

from .. import ops
from ..ops.contract import DTYPES, OpRun, family, families
from ..profiler import breakdown_ns
from ..topology.machine import load_machine
from ..units import parse_bytes, parse_pes

__all__ = ["Workload", "parse_workload", "add_paths", "run_point", "measure", "BUILTIN"]

#: Workloads by name that live outside kbtorch (the repository's models, on sys.path).
BUILTIN = {"qwen_layer": "kbtorch.models.qwen2_sweep:layer"}
_SINGLE_LIST = ("pes", "shape")


@dataclass(frozen=True)
class Workload:
    """A named workload: ``op`` (a family name or ``module:function``), fixed and swept params."""

    name: str
    op: str
    fixed: tuple
    swept: tuple

    def expand(self) -> list:
        """Every combination of the swept params, each as sorted ``(name, value)`` pairs."""
        names = [n for n, _ in self.swept]
        return [tuple(sorted((*self.fixed, *zip(names, combo))))
                for combo in itertools.product(*(vals for _, vals in self.swept))]


def parse_workload(name: str, table: dict, path: str, error, paths: tuple = ()) -> Workload:
    """Check ``[workloads.NAME]`` against its family's params or function's signature (a
    function is imported with ``paths`` on sys.path)."""
    field = f"workloads.{name}"
    table = dict(table)
    op, fn = table.pop("op", None), table.pop("fn", None)
    if (op is None) == (fn is None):
        raise error(path, field, "give exactly one of op (a registered op family or qwen_layer) and fn ('module:function')")
    target = fn if fn is not None else BUILTIN.get(op, op)
    if ":" in target:
        add_paths(paths)
        accepts = _signature(target, path, f"{field}.{'fn' if fn else 'op'}", error)
        kinds = {}
        unknown = [p for p in table if accepts is not None and p not in accepts]
    else:
        ops.load_families()
        if op not in {f.name for f in families()}:
            raise error(path, f"{field}.op", f"unknown op family '{op}' (known: {', '.join(sorted(f.name for f in families()))}, qwen_layer)")
        kinds = {p.name: p for p in family(op).params}
        unknown = [p for p in table if p not in kinds]
        missing = [p.name for p in kinds.values() if p.required and p.name not in table]
        if missing:
            raise error(path, f"{field}.{missing[0]}", f"required by op family '{op}'")
    if unknown:
        known = ", ".join(kinds) if kinds else ", ".join(accepts)
        raise error(path, f"{field}.{unknown[0]}", f"unknown param (known: {known})")
    fixed, swept = [], []
    for key, value in table.items():
        values = _swept(kinds.get(key), value)
        for v in values or [value]:
            if key in kinds:
                _check(kinds[key], v, path, f"{field}.{key}", error)
        (swept.append((key, tuple(values))) if values else fixed.append((key, value)))
    return Workload(name, target, tuple(fixed), tuple(swept))


def _signature(target: str, path, field, error):
    """The keyword names ``module:function`` accepts (None: any); imports it."""
    try:
        fn = resolve(target)
    except (ImportError, AttributeError, ValueError) as exc:
        raise error(path, field, f"cannot import '{target}': {exc}") from None
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return [n for n in params if n != "machine"]


def add_paths(paths) -> None:
    """Put ``paths`` (the spec's directory, the working directory) on sys.path, for ``fn`` workloads."""
    for p in paths:
        if p not in sys.path:
            sys.path.insert(0, p)


def resolve(target: str):
    module, _, name = target.partition(":")
    if not module or not name:
        raise ValueError("expected 'module:function'")
    return getattr(importlib.import_module(module), name)


def _swept(param, value) -> list | None:
    """The values of a swept param (a list; for ``pes`` and ``shape`` a list of lists or strings)."""
    if not isinstance(value, list):
        return None
    if param is not None and param.kind in _SINGLE_LIST and all(isinstance(v, int) for v in value):
        return None
    return value


def _check(param, value, path, field, error) -> None:
    ok = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
          "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "flag": lambda v: isinstance(v, bool), "dtype": lambda v: v in DTYPES,
          "str": lambda v: isinstance(v, str) and (not param.choices or v in param.choices),
          "pes": lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(i, int) for i in v)),
          "shape": lambda v: isinstance(v, list) and all(isinstance(i, int) and i > 0 for i in v),
          "bytes": _is_bytes}[param.kind]
    if not ok(value):
        extra = f" (one of {', '.join(param.choices or DTYPES)})" if param.kind in ("str", "dtype") else ""
        raise error(path, field, f"expected a {param.kind} value{extra}, got {value!r}")


def _is_bytes(value) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return value > 0
    try:
        return isinstance(value, str) and parse_bytes(value, minimum=1) > 0
    except ValueError:
        return False


def _convert(op: str, params: dict, machine) -> dict:
    """Params as the family's run takes them: byte counts and PE lists parsed, shapes as tuples."""
    if ":" in op:
        return params
    kinds = {p.name: p.kind for p in family(op).params}
    out = {}
    for key, value in params.items():
        kind = kinds[key]
        if kind == "bytes" and isinstance(value, str):
            value = parse_bytes(value, minimum=1)
        elif kind == "pes" and isinstance(value, str):
            value = parse_pes(value, len(machine.pes))
        elif kind == "shape":
            value = tuple(value)
        out[key] = value
    return out


def run_point(point) -> dict:
    """Run one point -> its row of figures (``error`` set, figures empty, if it failed)."""
    t0 = time.perf_counter()
    try:
        machine = load_machine(point.topology, dict(point.overrides) or None)
        ops.load_families()      # NOTE: a fresh worker process has imported only what kbtorch imports
        fn = resolve(point.op) if ":" in point.op else family(point.op).run
        row = measure(fn(machine=machine, **_convert(point.op, dict(point.params), machine)))
    except Exception as exc:  # noqa: BLE001 - NOTE: a failing point is recorded, the sweep goes on
        row = {"error": f"{type(exc).__name__}: {exc}"}
    row["wall_s"] = time.perf_counter() - t0
    return row


def measure(run) -> dict:
    """The figures of a workload's result: an ``OpRun`` or a dict with ``latency_ns``."""
    if isinstance(run, dict):
        if "latency_ns" not in run:
            raise ValueError("a workload's dict result needs 'latency_ns'")
        return {k: v for k, v in run.items() if k != "wall_s"}
    if not isinstance(run, OpRun):
        raise TypeError(f"a workload returns an OpRun or a dict, got {type(run).__name__}")
    s = run.summary()
    row = {"latency_ns": s["latency_ns"], "bottleneck": s["bottleneck"], "plan": s["plan"], "events": s["events"],
           "pct_peak": run.pct_peak if run.flops else None, "pct_bound": run.pct_bound}
    row.update({f"ns_{kind}": ns for kind, ns in breakdown_ns(run.result).items()})
    return row
