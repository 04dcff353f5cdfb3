"""Workloads of a sweep and how one point runs: a registered op family (``op = "gemm"``) or any
``fn = "module:function"`` called as ``function(machine=..., **params)`` (the Qwen2 decoder
layer: ``fn = "kbtorch.models.qwen2_sweep:layer"``); each returns an ``OpRun`` (or a dict with at
least ``latency_ns``), turned into one row of figures by :func:`measure`. NOTE: a study names
a model's workload in its file; the sweep never names models (the layer order).
"""
from __future__ import annotations

import importlib
import inspect
import itertools
import math
import os
import sys
import time
from dataclasses import dataclass

from .. import ops
from ..ops.contract import DTYPES, OpRun, family, families
from ..profiler import breakdown_ns
from ..topology.errors import did_you_mean
from ..topology.machine import load_machine
from ..units import parse_bytes, parse_pes
from .guard import PointTimeout, guard

__all__ = ["Workload", "parse_workload", "add_paths", "run_point", "measure"]

_SINGLE_LIST = ("pes", "shape")
#: The keywords the sweep fills in for an ``fn`` workload, never the spec: ``machine`` (the
#: point's), and ``store`` when the function takes it (the path of the sweep's store, for a
#: cache that outlives the point: ``kbtorch.serve.sweep``'s step times).
FILLED = ("machine", "store")


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


def parse_workload(name: str, table: dict, path: str, error, paths: tuple = (), budget=None) -> Workload:
    """Check ``[workloads.NAME]`` against its family's params or function's signature (a
    function is imported with ``paths`` on sys.path); ``budget(count)`` is told how many
    param combinations it has before any value is checked (it raises when they are too many)."""
    field = f"workloads.{name}"
    table = dict(table)
    op, fn = table.pop("op", None), table.pop("fn", None)
    if (op is None) == (fn is None):
        raise error(path, field, "give exactly one of op (a registered op family) and fn ('module:function')")
    if not isinstance(op if fn is None else fn, str):
        key = "op" if fn is None else "fn"
        raise error(path, f"{field}.{key}", f"expected a string, got {op if fn is None else fn!r}")
    if fn is not None and ":" not in fn:
        raise error(path, f"{field}.fn", f"expected 'module:function', got {fn!r}")
    target = fn if fn is not None else op
    if fn is not None:
        add_paths(paths)
        accepts = _signature(target, path, f"{field}.fn", error, paths)
        kinds = {}
        unknown = [p for p in table if accepts is not None and p not in accepts]
    else:
        ops.load_families()
        names = sorted(f.name for f in families())
        if op not in names:
            raise error(path, f"{field}.op", f"unknown op family '{op}' (known: {', '.join(names)})"
                                             f"{did_you_mean(op, names)}")
        kinds = {p.name: p for p in family(op).params}
        unknown = [p for p in table if p not in kinds]
        missing = [p.name for p in kinds.values() if p.required and p.name not in table]
        if missing:
            raise error(path, f"{field}.{missing[0]}", f"required by op family '{op}'")
    if unknown:
        known = list(kinds) if kinds else accepts
        raise error(path, f"{field}.{unknown[0]}", f"unknown param (known: {', '.join(known)})"
                                                    f"{did_you_mean(unknown[0], known)}")
    split = {key: _swept(kinds.get(key), value) for key, value in table.items()}
    if budget is not None:
        budget(math.prod(len(v) for v in split.values() if v is not None))
    fixed, swept = [], []
    for key, value in table.items():
        values = split[key]
        if values is not None:
            _distinct(values, path, f"{field}.{key}", error)
        for v in values or [value]:
            if key in kinds:
                _check(kinds[key], v, path, f"{field}.{key}", error)
        (swept.append((key, tuple(values))) if values else fixed.append((key, value)))
    return Workload(name, target, tuple(fixed), tuple(swept))


def same_key(value):
    """What makes two TOML values the same (256 and 256.0 are; true and 1 are not)."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("num", value)
    if isinstance(value, list):
        return ("list", tuple(same_key(v) for v in value))
    if isinstance(value, dict):
        return ("table", tuple(sorted((k, same_key(v)) for k, v in value.items())))
    return (type(value).__name__, value)


def _distinct(values: list, path, field, error) -> None:
    seen: dict = {}
    for v in values:
        if same_key(v) in seen:
            raise error(path, field, f"the value {v!r} is the same as {seen[same_key(v)]!r}: each value once")
        seen[same_key(v)] = v


def _signature(target: str, path, field, error, paths=()):
    """The keyword names ``module:function`` accepts (None: any); imports it."""
    try:
        fn = resolve(target)
    except (ImportError, AttributeError, ValueError) as exc:
        raise error(path, field, f"cannot import '{target}': {exc}{_shadowed(target, paths)}") from None
    except Exception as exc:  # noqa: BLE001 - NOTE: importing runs the module's code: any fault is the spec's
        raise error(path, field, f"importing '{target}' failed: {type(exc).__name__}: {exc}") from None
    hidden = _shadowed(target, paths)
    if hidden:
        raise error(path, field, f"'{target}':{hidden}")
    if not callable(fn) or inspect.isclass(fn):
        raise error(path, field, f"'{target}' is a {type(fn).__name__}, not a function "
                                 "(expected 'module:function' taking machine= and the params)")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return [n for n in params if n not in FILLED]


def _shadowed(target: str, paths) -> str:
    """A note when the spec's folder has a module of ``target``'s name that an installed one hides."""
    top = target.partition(":")[0].split(".")[0]
    found = sys.modules.get(top)
    own = [p for p in paths if os.path.exists(os.path.join(p, top + ".py")) or os.path.isdir(os.path.join(p, top))]
    where = [getattr(found, "__file__", None) or ""] + list(getattr(found, "__path__", None) or [])
    if own and found is not None and not any(w.startswith(os.path.join(p, "")) for w in where for p in own):
        return (f" ('{top}' is the installed module at {where[0] or where[-1]}; the spec folder's {top} is not "
                "imported, as it would hide that module: rename it)")
    return ""


#: Folders :func:`add_paths` put on sys.path (the current spec's).
_ADDED: list = []


def add_paths(paths) -> None:
    """Put ``paths`` (the working directory, the spec's directory) at the END of sys.path, for
    ``fn`` workloads. NOTE: at the end, so that a file beside the spec (a ``dask.py``) never
    shadows an installed module that kbtorch or the sweep imports. The folders of an earlier
    spec leave sys.path and the modules imported from them are forgotten, so that a spec's
    ``fn`` is its own folder's module, never a namesake of another spec's."""
    stale = [p for p in _ADDED if p not in paths]
    for p in stale:
        _ADDED.remove(p)
        if p in sys.path:
            sys.path.remove(p)
    inside = tuple(os.path.join(p, "") for p in stale)
    for name, module in list(sys.modules.items()) if stale else ():
        if (getattr(module, "__file__", None) or "").startswith(inside):
            del sys.modules[name]
    for p in paths:
        if p not in sys.path:
            sys.path.append(p)
            _ADDED.append(p)


def resolve(target: str):
    module, _, name = target.partition(":")
    if not module or not name:
        raise ValueError("expected 'module:function'")
    return getattr(importlib.import_module(module), name)


def _swept(param, value) -> list | None:
    """The values of a swept param (a list; for ``pes`` and ``shape`` a list of lists or strings)."""
    if not isinstance(value, list) or not value:
        return None
    if param is not None and param.kind in _SINGLE_LIST and all(isinstance(v, int) for v in value):
        return None
    return value


def _check(param, value, path, field, error) -> None:
    ok = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
          "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
          "flag": lambda v: isinstance(v, bool), "dtype": lambda v: v in DTYPES,
          "str": lambda v: isinstance(v, str) and (not param.choices or v in param.choices),
          "pes": lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(i, int) for i in v)),
          "shape": lambda v: isinstance(v, list) and all(isinstance(i, int) and i > 0 for i in v),
          "bytes": _is_bytes}[param.kind]
    if not ok(value):
        extra = f" (one of {', '.join(param.choices or DTYPES)})" if param.kind in ("str", "dtype") else ""
        article = "an" if param.kind[0] in "aeiou" else "a"
        raise error(path, field, f"expected {article} {param.kind} value{extra}, got {value!r}")


def _is_bytes(value) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return value > 0
    try:
        return isinstance(value, str) and parse_bytes(value, minimum=1) > 0
    except ValueError:
        return False


def convert(op: str, params: dict, machine) -> dict:
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


def run_point(point, machine=None, seconds: float | None = None, nbytes: int | None = None,
              store: str | None = None) -> dict:
    """Run one point (on ``machine``, else its topology loaded) within ``seconds`` of wall
    time and ``nbytes`` of new memory (``guard``) -> its row of figures (``error`` set,
    figures empty, if it failed); ``store``: the sweep's store, for a function taking it."""
    t0 = time.perf_counter()
    try:
        with guard(seconds, nbytes):
            if machine is None:
                machine = load_machine(point.topology, dict(point.overrides) or None)
            ops.load_families()      # NOTE: a fresh worker process has imported only what kbtorch imports
            fn = resolve(point.op) if ":" in point.op else family(point.op)
            extra = {"store": store} if ":" in point.op and _takes_store(fn) else {}
            row = measure(fn(machine=machine, **extra, **convert(point.op, dict(point.params), machine)))
    except SystemExit as exc:
        # NOTE: a workload that calls sys.exit() fails its point; it never ends the sweep.
        row = {"error": f"SystemExit: the workload called sys.exit({exc.code!r})"}
    except MemoryError as exc:
        limit = f"its memory limit of {nbytes} bytes (KBTORCH_MAX_POINT_BYTES or --point-memory)" if nbytes else ""
        row = {"error": f"MemoryError: {str(exc) or 'out of memory'}{'; the point needed more than ' + limit if limit else ''}"}
    except PointTimeout:
        row = {"error": f"PointTimeout: the point ran longer than its time limit of {seconds:g} s "
                        f"(KBTORCH_MAX_POINT_S or --point-timeout)"}
    except Exception as exc:  # noqa: BLE001 - NOTE: a failing point is recorded, the sweep goes on
        row = {"error": f"{type(exc).__name__}: {exc}"}
    row["wall_s"] = time.perf_counter() - t0
    return row


def _takes_store(fn) -> bool:
    try:
        return "store" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


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
