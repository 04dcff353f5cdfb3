"""A sweep spec: a TOML file naming a base topology, axes, workloads and how they combine.

    [sweep]
    topology = "ahbm"                          # the base topology (name or path)
    [axes]
    topology = ["ahbm", "ahbm_torus"]          # choose among topologies
    "links.noc.bw_gbps" = [128, 256, 512]      # any topology field by its dotted path
    hbm = { paths = ["components.hbm_slice.channel_gbps", "links.hbm.bw_gbps"], scale = [0.5, 1, 2] }
    [workloads.gemm_s128]
    op = "gemm"                                # a registered op family, or fn = "module:fn"
    m = 128                                    # its params; a list sweeps them (composite = [true, false])

The points are the cross product of the axes' values and every workload's expanded params,
(``[sweep] combine = "one_at_a_time"``: the base point and each axis' other values with the
rest at base), or the explicit ``[[points]]`` (``workload = NAME`` plus axis values, e.g.
``"links.noc.bw_gbps" = 512``). Every error names the file and the field
(``study.toml: axes.links.noc.bw_gbps: ...``), before anything runs: the file's size and
nesting and the number of points (``KBTORCH_MAX_POINTS``) before anything is expanded, then
every axis value on every topology, every workload's params on every machine of the sweep
(``check``), and that no two axes, values, workloads or points merge silently.
"""
from __future__ import annotations

import importlib.resources
import itertools
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..limits import LIMITS
from ..topology.errors import TopologyError, did_you_mean
from ..topology.load.pipeline import override_entry, resolve_doc
from ..topology.machine import DEFAULT_MACHINE, topology_path
from ..topology.select import ENV as TOPOLOGY_ENV
from ..topology.load.overrides import CHIP_PREFIX
from .spec_file import SpecError, limit_of, read
from .check import check_axes, check_distinct, check_machines, check_points, combos
from .workloads import parse_workload, same_key

__all__ = ["SpecError", "Axis", "Point", "Spec", "load_spec", "study_path", "base_value", "COMBINE", "STUDY_DIR"]

#: How axes combine: every combination, or one axis away from the base at a time.
COMBINE = ("product", "one_at_a_time")
#: The shipped studies: package data (kbtorch/studies/*.toml), run by name from any directory.
STUDY_DIR = Path(str(importlib.resources.files("kbtorch") / "studies"))
#: ``sweep.name`` names the plot files: no path separators, no leading dot.
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")


@dataclass(frozen=True)
class Axis:
    """A hardware lever: ``paths`` of the topology it sets (none: the ``topology`` axis), the
    values shown (``values``) and, with ``scale``, factors of each topology's own value."""

    name: str
    paths: tuple
    values: tuple
    scale: bool = False


@dataclass(frozen=True)
class Point:
    """One run: topology and overrides, a workload and its params; ``axes`` are the values of
    the axes as shown (a scale factor, not the scaled value)."""

    topology: str
    overrides: tuple
    workload: str
    op: str
    params: tuple
    axes: tuple

    def canonical(self) -> dict:
        """What determines the result (the key hashes it): not the names shown."""
        return {"topology": self.topology, "overrides": dict(self.overrides), "op": self.op,
                "params": dict(self.params)}


@dataclass(frozen=True)
class Spec:
    path: str
    name: str
    topology: str
    axes: tuple
    workloads: tuple
    points: tuple
    #: Where ``fn`` workloads are imported from: the working directory and the spec's directory.
    import_paths: tuple = ()
    #: How the axes combine (``COMBINE``): a cross product, or one axis off the base at a time.
    combine: str = "product"

    def base(self, axis: Axis):
        """The axis' value at the base machine: factor 1, the base topology, or the file's value."""
        return base_value(axis, self.topology)


def base_value(axis: Axis, topology: str):
    """``axis``' value on ``topology`` unchanged (factor 1, the topology, the file's value),
    else its first value."""
    if axis.scale:
        value = 1.0
    elif not axis.paths:
        value = topology
    else:
        value = override_entry(topology_path(topology), axis.paths[0])
    return value if value in axis.values else axis.values[0]


def study_path(name_or_path) -> str:
    """A shipped study by name (``gemm_composite``: ``STUDY_DIR/gemm_composite.toml``), or a path."""
    text = os.fspath(name_or_path)
    if text.endswith(".toml") or os.sep in text:
        return text
    candidate = STUDY_DIR / f"{text}.toml"
    if not candidate.exists():
        known = ", ".join(sorted(p.stem for p in STUDY_DIR.glob("*.toml")))
        raise SpecError(text, "file", f"no such spec file nor shipped study (shipped: {known})")
    return str(candidate)


def load_spec(path) -> Spec:
    """Read and validate a sweep spec, a path or a shipped study's name (SpecError names the
    file and the field): every axis value on every topology, every workload's params on every
    machine of the sweep, and the number of points against ``KBTORCH_MAX_POINTS``, before any
    point exists."""
    path = study_path(path)
    doc = read(path)
    unknown = sorted(set(doc) - {"sweep", "axes", "workloads", "points"})
    if unknown:
        raise SpecError(path, unknown[0], "unknown section (known: sweep, axes, workloads, points)"
                        + did_you_mean(unknown[0], ["sweep", "axes", "workloads", "points"]))
    head = _table(doc.get("sweep", {}), path, "sweep")
    bad = sorted(set(head) - {"topology", "name", "combine"})
    if bad:
        raise SpecError(path, f"sweep.{bad[0]}", "unknown field (known: topology, name, combine)"
                        + did_you_mean(bad[0], ["topology", "name", "combine"]))
    combine = head.get("combine", "product")
    if combine not in COMBINE:
        raise SpecError(path, "sweep.combine", f"expected one of {', '.join(COMBINE)}, got {combine!r}"
                        + did_you_mean(combine, COMBINE))
    name = _name(head.get("name", Path(path).stem), path)
    # NOTE: without sweep.topology, $KBTORCH_TOPOLOGY (else ahbm) as everywhere else; the
    # keys hold the machine's content, so a store's results never depend on the environment.
    env = os.environ.get(TOPOLOGY_ENV)
    base = (_topology(head.get("topology", DEFAULT_MACHINE), path, "sweep.topology") if "topology" in head or not env
            else _topology(env, path, f"${TOPOLOGY_ENV} (the spec has no sweep.topology)"))
    axes = tuple(_axes(_table(doc.get("axes", {}), path, "axes"), path))
    check_axes(axes, base, path, SpecError)
    wl = _table(doc.get("workloads", {}), path, "workloads")
    if not wl:
        raise SpecError(path, "workloads", "no workload: add a [workloads.NAME] table")
    raw_points = doc.get("points")
    if raw_points is not None and axes:
        raise SpecError(path, "points", "give either [axes] (cross product) or [[points]] (explicit), not both")
    if raw_points is not None and (not isinstance(raw_points, list) or not raw_points):
        raise SpecError(path, "points", "expected [[points]] tables")
    budget = _Budget(path, len(raw_points) if raw_points is not None else combos(axes, combine))
    paths = (os.getcwd(), str(Path(path).resolve().parent))
    workloads = tuple(parse_workload(n, _table(t, path, f"workloads.{n}"), path, SpecError, paths, budget)
                      for n, t in wl.items())
    check_distinct(workloads, path, SpecError)
    points = _explicit(raw_points, base, workloads, path) if raw_points is not None \
        else _product(base, axes, workloads, path, combine)
    check_points(points, path, SpecError)
    check_machines(points, workloads, path, SpecError, axes)
    return Spec(path, name, base, axes, workloads, tuple(points), paths, combine)


class _Budget:
    """Counts the points as the workloads are read (``combos`` machines each), before any is
    made; SpecError once they exceed ``KBTORCH_MAX_POINTS``."""

    def __init__(self, path: str, combos: int):
        self.path, self.combos, self.total, self.most = path, combos, 0, limit_of(path, "points")
        self(0)

    def __call__(self, count: int) -> None:
        self.total += self.combos * count
        if self.total > self.most or self.combos > self.most:
            raise SpecError(self.path, "sweep", f"{max(self.total, self.combos)} points or more exceed the limit of "
                            f"{self.most} (set {LIMITS['points'][0]} to raise it)")


def _name(value, path: str) -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise SpecError(path, "sweep.name", "expected a name of letters, digits, '_', '-' and '.' (not starting "
                        f"with '.'; it names the plot files), got {value!r}")
    return value


def _table(value, path, field) -> dict:
    if not isinstance(value, dict):
        raise SpecError(path, field, f"expected a table, got {type(value).__name__}")
    return value


def _topology(value, path, field) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(path, field, f"expected a topology name or path, got {value!r}")
    near = Path(path).resolve().parent / value
    name = str(near) if value.endswith(".toml") and near.exists() else value
    tpath = None
    try:
        tpath = topology_path(name)
        resolve_doc(tpath)
    except TopologyError as exc:
        where = "" if exc.entry in ("name", "file") else f"{exc.entry}: "
        # NOTE: a fault in a file the topology reads (a system's chip file) names that file.
        inner = f"its file {exc.path}: " if tpath and exc.path and Path(exc.path).resolve() != Path(tpath).resolve() else ""
        raise SpecError(path, field, f"'{value}': {inner}{where}{exc.message}") from None
    return name


def _axes(table: dict, path: str, prefix: str = ""):
    """Flatten ``[axes]``: TOML dotted keys nest, so a list or an axis table is a leaf."""
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and not ({"path", "paths"} & set(value)):
            yield from _axes(value, path, name + ".")
        else:
            yield _axis(name, value, path)


def _axis(name: str, value, path: str) -> Axis:
    field = f"axes.{name}"
    if name == "topology":
        values = _values(value, path, field)
        return Axis(name, (), tuple(_topology(v, path, field) for v in values))
    if not isinstance(value, dict):
        return Axis(name, (name,), _values(value, path, field))
    bad = sorted(set(value) - {"path", "paths", "values", "scale"})
    if bad:
        raise SpecError(path, f"{field}.{bad[0]}", "unknown field of an axis table (known: path, paths, values, scale)"
                        + did_you_mean(bad[0], ["path", "paths", "values", "scale"]))
    if "path" in value and "paths" in value:
        raise SpecError(path, field, "give path (one) or paths (several), not both")
    if ("values" in value) == ("scale" in value):
        raise SpecError(path, field, "an axis table has exactly one of values and scale")
    paths = value.get("paths", [value.get("path")])
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and p for p in paths):
        raise SpecError(path, f"{field}.paths", "expected a dotted path or a list of them")
    if len(set(paths)) != len(paths):
        raise SpecError(path, f"{field}.paths", f"'{next(p for p in paths if paths.count(p) > 1)}' is listed twice")
    scale = "scale" in value
    values = _values(value["scale" if scale else "values"], path, f"{field}.{'scale' if scale else 'values'}")
    if scale and not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf for v in values):
        raise SpecError(path, f"{field}.scale", f"factors must be finite positive numbers, got {list(values)}")
    return Axis(name, tuple(paths), tuple(float(v) for v in values) if scale else values, scale)


def _values(value, path, field) -> tuple:
    if not isinstance(value, list) or not value:
        raise SpecError(path, field, f"expected a non-empty list of values, got {value!r}")
    seen: dict = {}
    for v in value:
        if not isinstance(v, (bool, int, float, str)):
            kind = "table" if isinstance(v, dict) else type(v).__name__
            raise SpecError(path, field, f"the value {v!r} is a {kind}: "
                            "an axis value is a number, a string or a boolean (use [[points]] to set lists or tables)")
        if same_key(v) in seen:
            raise SpecError(path, field, f"the value {v!r} is the same as {seen[same_key(v)]!r}: each value once")
        seen[same_key(v)] = v
    return tuple(value)


def _overrides(topology: str, settings: list, path: str, field: str) -> tuple:
    """The overrides of ``settings`` ([(axis, value)]) on ``topology``, checked against its schema."""
    tpath, shown = topology_path(topology), Path(topology).stem
    out, by_path = {}, {}
    for axis, value in settings:
        for dotted in axis.paths:
            try:
                current = override_entry(tpath, dotted)
            except TopologyError as exc:
                raise SpecError(path, f"{field}.{axis.name}", f"{exc.message} (on topology '{shown}')") from None
            out[dotted] = current * value if axis.scale else value
            by_path[dotted] = axis.name
    try:
        resolve_doc(tpath, out)
    except TopologyError as exc:
        # NOTE: a system's chip file reports its own entries: ``chip.X`` of the system.
        entry = exc.entry if exc.path == tpath else CHIP_PREFIX + exc.entry
        exc = TopologyError(exc.path, entry, exc.message)
        hit = [d for d in out if entry == d or entry.startswith(d + ".") or entry.startswith(d + "[")]
        if hit:
            name = by_path[hit[0]]
            where = f"{exc.entry}: " if exc.entry != name else ""
            raise SpecError(path, f"{field}.{name}", f"{where}{exc.message} (on topology '{shown}')") from None
        # NOTE: a fault elsewhere that the settings caused (a tray count leaving a switch tier
        # without an uplink): named by the settings, then the entry at fault.
        at = f"{field}.{settings[0][0].name}" if len(settings) == 1 else field
        cause = f"= {settings[0][1]!r}" if len(settings) == 1 else \
            "with " + ", ".join(f"{a.name} = {v!r}" for a, v in settings)
        raise SpecError(path, at, f"{cause} leaves {exc.entry} at fault: {exc.message} (on topology '{shown}')") from None
    return tuple(sorted(out.items()))


def _combos(base: str, axes: tuple, combine: str) -> list:
    """Every combination of the axes' values, or (``one_at_a_time``) the base and each axis'
    other values with the rest at base."""
    if combine == "product":
        return list(itertools.product(*(a.values for a in axes)))
    at_base = tuple(base_value(a, base) for a in axes)
    return [at_base] + [at_base[:i] + (v,) + at_base[i + 1:] for i, a in enumerate(axes) for v in a.values
                        if v != at_base[i]]


def _product(base: str, axes: tuple, workloads: tuple, path: str, combine: str) -> list:
    points = []
    checked: dict = {}
    for combo in _combos(base, axes, combine):
        chosen = dict(zip(axes, combo))
        topo = next((v for a, v in chosen.items() if not a.paths), base)
        settings = [(a, v) for a, v in chosen.items() if a.paths]
        ident = (topo, tuple((a.name, repr(v)) for a, v in settings))
        if ident not in checked:
            checked[ident] = _overrides(topo, settings, path, "axes")
        shown = tuple((a.name, v) for a, v in chosen.items())
        points += [Point(topo, checked[ident], w.name, w.op, params, shown) for w in workloads for params in w.expand()]
    return points


def _explicit(raw, base: str, workloads: tuple, path: str) -> list:
    by_name = {w.name: w for w in workloads}
    total = 0
    for i, entry in enumerate(raw):
        total += len(by_name[entry["workload"]].expand()) if isinstance(entry, dict) and \
            isinstance(entry.get("workload"), str) and entry["workload"] in by_name else 0
    _Budget(path, 1)(total)
    points = []
    for i, entry in enumerate(raw):
        field = f"points[{i}]"
        entry = dict(_table(entry, path, field))
        name = entry.pop("workload", None)
        if name not in by_name:
            raise SpecError(path, f"{field}.workload", f"expected one of {sorted(by_name)}, got {name!r}"
                            + did_you_mean(name, by_name))
        topo = _topology(entry.pop("topology"), path, f"{field}.topology") if "topology" in entry else base
        settings = [(Axis(k, (k,), ()), v) for k, v in entry.items()]
        over = _overrides(topo, settings, path, field)
        shown = (("topology", topo),) + tuple(entry.items())
        points += [Point(topo, over, name, by_name[name].op, params, shown) for params in by_name[name].expand()]
    return points
