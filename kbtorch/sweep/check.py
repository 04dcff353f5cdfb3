"""Checks of a sweep spec that span its parts, all made before any point runs.

- ``check_axes``: no two axes set the same topology entry (one inside another counts: the
  same field as a quoted and a dotted key, or under two names), and every path names an
  entry of every topology of the sweep (a ``scale`` axis: a number).
- ``check_distinct``: no two workloads (and no two points) are the same run, so that no
  row stands for a point that did not run.
- ``check_machines``: every workload's params pass its op family's own checks
  (``OpFamily.check``: PE lists, grids, groups, GQA ratios, HBM capacity, limits) on every
  machine of the sweep, and every machine compiles. NOTE: a machine is compiled for this
  once per set of overrides other than timing-only ones (:func:`timing_only`: link, issue
  and launch parameters, bandwidths, latencies, clock and peak rates), which never change
  which params are valid: the checks read PEs, groups, capacities and op names only.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from .. import ops
from ..ops.contract import family
from ..topology.errors import TopologyError
from ..topology.load.pipeline import override_entry
from ..topology.load.overrides import CHIP_PREFIX
from ..topology.machine import load_machine, topology_path
from .workloads import convert, same_key

__all__ = ["combos", "check_axes", "check_distinct", "check_points", "check_machines", "timing_only"]

#: Top-level sections of a topology whose overrides change timing only.
TIMING_ONLY = ("links", "issue", "launch")
_TIMING_FIELD = re.compile(r"_(gbps|ns|ghz|cycles)$")


def timing_only(dotted: str) -> bool:
    """Whether an override at ``dotted`` changes timing only (see the module docstring)."""
    parts = _parts(dotted.removeprefix(CHIP_PREFIX))
    return (parts[0] in TIMING_ONLY or _TIMING_FIELD.search(parts[-1]) is not None
            or (len(parts) > 1 and parts[-2] == "tflops"))


def _parts(dotted: str) -> tuple:
    return tuple(p for p in re.split(r"[.\[\]]+", dotted) if p)


def combos(axes: tuple, combine: str) -> int:
    """How many machines the axes make, without making them."""
    if combine == "product":
        return math.prod(len(a.values) for a in axes)
    return 1 + sum(len(a.values) - 1 for a in axes)


def check_axes(axes: tuple, base: str, path: str, error) -> None:
    owner: dict = {}
    for axis in axes:
        for dotted in axis.paths:
            parts = _parts(dotted)
            for other, (name, text) in owner.items():
                if parts[:len(other)] == other or other[:len(parts)] == parts:
                    what = f"sets the same entry as axes.{name}" if other == parts else \
                        f"overlaps '{text}' of axes.{name}"
                    raise error(path, f"axes.{axis.name}", f"'{dotted}' {what} (one axis per entry; a quoted "
                                "and a dotted key are the same path)")
            owner[parts] = (axis.name, dotted)
    topologies = [base] + [v for a in axes if not a.paths for v in a.values]
    for topology in dict.fromkeys(topologies):
        tpath = topology_path(topology)
        for axis in (a for a in axes if a.paths):
            for dotted in axis.paths:
                _check_path(dotted, axis, tpath, Path(topology).stem, path, error)


def _check_path(dotted, axis, tpath, shown, path, error) -> None:
    try:
        value = override_entry(tpath, dotted)
    except TopologyError as exc:
        raise error(path, f"axes.{axis.name}", f"{exc.message} (on topology '{shown}')") from None
    if axis.scale and (isinstance(value, bool) or not isinstance(value, (int, float))):
        kind = "table" if isinstance(value, dict) else type(value).__name__
        raise error(path, f"axes.{axis.name}.scale", f"'{dotted}' is a {kind} ({value!r}) on topology '{shown}': "
                    "a scale multiplies a number")


def check_distinct(workloads: tuple, path: str, error) -> None:
    """No two workloads share a run: the same op with the same params."""
    seen: dict = {}
    for w in workloads:
        for params in w.expand():
            key = (w.op, tuple((n, same_key(v)) for n, v in params))
            if key in seen and seen[key] != w.name:
                shown = ", ".join(f"{n}={v!r}" for n, v in params) or "no params"
                raise error(path, f"workloads.{w.name}", f"the same run as workloads.{seen[key]} ({w.op}, {shown}): "
                            "each run once")
            seen.setdefault(key, w.name)


def check_points(points: list, path: str, error) -> None:
    """No two points are the same run (explicit points, axes that meet in one machine)."""
    seen: dict = {}
    for i, p in enumerate(points):
        key = json.dumps([p.topology, same_key(dict(p.overrides)), p.op, same_key(dict(p.params))])
        if key in seen:
            raise error(path, "points", f"point {i} ({p.workload} on {_machine(p.topology, p.overrides)}) is the same "
                        f"run as point {seen[key]}: each run once")
        seen[key] = i


def check_machines(points: list, workloads: tuple, path: str, error, axes: tuple = ()) -> None:
    """Every machine of the sweep compiles, and every family workload's params pass its
    family's checks on each."""
    machines: dict = {}
    for p in points:
        over = tuple((k, v) for k, v in p.overrides if not timing_only(k))
        machines.setdefault(json.dumps([p.topology, same_key(dict(over))]), (p.topology, over))
    runs = [(w, params) for w in workloads if ":" not in w.op for params in w.expand()]
    ops.load_families()
    names = {dotted: a.name for a in axes for dotted in a.paths}
    for topology, over in machines.values():
        try:
            machine = load_machine(topology, dict(over) or None)
        except TopologyError as exc:
            set_by = list(dict.fromkeys(names.get(k, k) for k, _ in over))
            field = f"axes.{set_by[0]}" if len(set_by) == 1 else ("points" if not axes else "axes")
            raise error(path, field, f"{exc.entry}: {exc.message} (on {_machine(topology, over)})") from None
        for w, params in runs:
            fault = _fault(w.op, dict(params), machine)
            if fault is not None:
                field = _culprit(w.op, dict(params), machine)
                where = _machine(topology, over)
                if f"topology '{Path(topology).stem}'" in fault and not over:
                    where = ""
                swept = _swept(w, params)
                note = f" (on {where}{swept})" if where else (f" ({swept[2:]})" if swept else "")
                raise error(path, f"workloads.{w.name}{'.' + field if field else ''}", fault + note)


def _fault(op: str, params: dict, machine) -> str | None:
    """The message of the family's check of ``params`` on ``machine`` (None: they pass)."""
    check = family(op).check
    if check is None:
        return None
    try:
        check(machine=machine, **convert(op, params, machine))
    except (ValueError, TypeError, KeyError) as exc:
        return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return None


def _culprit(op: str, params: dict, machine) -> str:
    """The param at fault: the first optional one that fails with the required ones alone,
    else the first required one ("": none found)."""
    required = [p.name for p in family(op).params if p.required and p.name in params]
    alone = {n: params[n] for n in required}
    if _fault(op, alone, machine) is None:
        for name in params:
            if name not in alone and _fault(op, {**alone, name: params[name]}, machine) is not None:
                return name
    return required[0] if required else ""


def _swept(w, params) -> str:
    names = {n for n, _ in w.swept}
    shown = ", ".join(f"{n}={v!r}" for n, v in params if n in names)
    return f", with {shown}" if shown else ""


def _machine(topology: str, over) -> str:
    settings = ", ".join(f"{k}={v!r}" for k, v in over)
    return f"topology '{Path(topology).stem}'" + (f" with {settings}" if settings else "")
