"""A sweep spec: a TOML file naming a base topology, axes, workloads and how they combine.

    [sweep]
    topology = "ahbm"                          # the base topology (name or path)
    [axes]
    topology = ["ahbm", "ahbm_torus"]          # choose among topologies
    "links.noc.bw_gbps" = [128, 256, 512]      # any topology field by its dotted path
    hbm = { paths = ["components.hbm_slice.channel_gbps", "links.hbm.bw_gbps"], scale = [0.5, 1, 2] }
    [workloads.gemm_s128]
    op = "gemm"                                # a registered op family, "qwen_layer", or fn = "module:fn"
    m = 128                                    # its params; a list sweeps them (composite = [true, false])

The points are the cross product of the axes' values and every workload's expanded params,
(``[sweep] combine = "one_at_a_time"``: the base point and each axis' other values with the
rest at base), or the explicit ``[[points]]`` (``workload = NAME`` plus axis values, e.g.
``"links.noc.bw_gbps" = 512``). Every error names the file and the field
(``study.toml: axes.links.noc.bw_gbps: ...``), before anything runs.
"""
from __future__ import annotations

import copy
import importlib.resources
import itertools
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..topology.errors import TopologyError
from ..topology.loader import read_toml
from ..topology.machine import topology_path
from ..topology.overrides import apply_overrides
from ..topology.validate import validate
from .workloads import parse_workload

__all__ = ["SpecError", "Axis", "Point", "Spec", "load_spec", "study_path", "base_value", "COMBINE", "STUDY_DIR"]

#: How axes combine: every combination, or one axis away from the base at a time.
COMBINE = ("product", "one_at_a_time")
#: The shipped studies: package data (kbtorch/studies/*.toml), run by name from any directory.
STUDY_DIR = Path(str(importlib.resources.files("kbtorch") / "studies"))


class SpecError(ValueError):
    """A malformed sweep spec: the message names the file and the field."""

    def __init__(self, path: str, field: str, message: str):
        super().__init__(f"{Path(path).name}: {field}: {message}")


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
        value = _get(read_toml(topology_path(topology)), axis.paths[0])
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
    file and the field)."""
    path = study_path(path)
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except OSError as exc:
        raise SpecError(path, "file", f"cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(path, "file", f"not valid TOML: {exc}") from None
    unknown = sorted(set(doc) - {"sweep", "axes", "workloads", "points"})
    if unknown:
        raise SpecError(path, unknown[0], "unknown section (known: sweep, axes, workloads, points)")
    head = _table(doc.get("sweep", {}), path, "sweep")
    bad = sorted(set(head) - {"topology", "name", "combine"})
    if bad:
        raise SpecError(path, f"sweep.{bad[0]}", "unknown field (known: topology, name, combine)")
    combine = head.get("combine", "product")
    if combine not in COMBINE:
        raise SpecError(path, "sweep.combine", f"expected one of {', '.join(COMBINE)}, got {combine!r}")
    base = _topology(head.get("topology", "ahbm"), path, "sweep.topology")
    axes = tuple(_axes(_table(doc.get("axes", {}), path, "axes"), path))
    wl = _table(doc.get("workloads", {}), path, "workloads")
    if not wl:
        raise SpecError(path, "workloads", "no workload: add a [workloads.NAME] table")
    paths = (os.getcwd(), str(Path(path).resolve().parent))
    workloads = tuple(parse_workload(name, _table(t, path, f"workloads.{name}"), path, SpecError, paths)
                      for name, t in wl.items())
    raw_points = doc.get("points")
    if raw_points is not None and axes:
        raise SpecError(path, "points", "give either [axes] (cross product) or [[points]] (explicit), not both")
    points = _explicit(raw_points, base, workloads, path) if raw_points is not None \
        else _product(base, axes, workloads, path, combine)
    return Spec(path, head.get("name", Path(path).stem), base, axes, workloads, tuple(points), paths)


def _table(value, path, field) -> dict:
    if not isinstance(value, dict):
        raise SpecError(path, field, f"expected a table, got {type(value).__name__}")
    return value


def _topology(value, path, field) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(path, field, f"expected a topology name or path, got {value!r}")
    near = Path(path).resolve().parent / value
    name = str(near) if value.endswith(".toml") and near.exists() else value
    try:
        topology_path(name)
    except TopologyError as exc:
        raise SpecError(path, field, f"'{value}': {exc.message}") from None
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
    if bad or ("values" in value) == ("scale" in value):
        raise SpecError(path, field, "an axis table has path or paths, and exactly one of values and scale")
    paths = value.get("paths", [value.get("path")])
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and p for p in paths):
        raise SpecError(path, f"{field}.paths", "expected a dotted path or a list of them")
    scale = "scale" in value
    values = _values(value["scale" if scale else "values"], path, f"{field}.{'scale' if scale else 'values'}")
    if scale and not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values):
        raise SpecError(path, f"{field}.scale", f"factors must be positive numbers, got {list(values)}")
    return Axis(name, tuple(paths), tuple(float(v) for v in values) if scale else values, scale)


def _values(value, path, field) -> tuple:
    if not isinstance(value, list) or not value:
        raise SpecError(path, field, f"expected a non-empty list of values, got {value!r}")
    if len(set(map(repr, value))) != len(value):
        raise SpecError(path, field, f"repeated values in {value}")
    return tuple(value)


def _get(doc: dict, dotted: str):
    node = doc
    for part in dotted.replace("[", ".").replace("]", "").split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _overrides(topology: str, settings: dict, path: str, field: str) -> tuple:
    """The overrides of ``settings`` ({axis: value}) on ``topology``, checked against its schema."""
    tpath = topology_path(topology)
    doc = read_toml(tpath)
    out = {}
    for axis, value in settings.items():
        for dotted in axis.paths:
            try:
                apply_overrides(copy.deepcopy(doc), {dotted: 0}, tpath)
            except TopologyError as exc:
                raise SpecError(path, f"{field}.{axis.name}", exc.message) from None
            out[dotted] = _get(doc, dotted) * value if axis.scale else value
    try:
        apply_overrides(doc, out, tpath)
        validate(doc, tpath)
    except TopologyError as exc:
        raise SpecError(path, f"{field}.{exc.entry}", f"{exc.message} (on topology '{topology}')") from None
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
        settings = {a: v for a, v in chosen.items() if a.paths}
        ident = (topo, tuple((a.name, repr(v)) for a, v in settings.items()))
        if ident not in checked:
            checked[ident] = _overrides(topo, settings, path, "axes")
        shown = tuple((a.name, v) for a, v in chosen.items())
        points += [Point(topo, checked[ident], w.name, w.op, params, shown) for w in workloads for params in w.expand()]
    return points


def _explicit(raw, base: str, workloads: tuple, path: str) -> list:
    if not isinstance(raw, list) or not raw:
        raise SpecError(path, "points", "expected [[points]] tables")
    by_name = {w.name: w for w in workloads}
    points = []
    for i, entry in enumerate(raw):
        field = f"points[{i}]"
        entry = dict(_table(entry, path, field))
        name = entry.pop("workload", None)
        if name not in by_name:
            raise SpecError(path, f"{field}.workload", f"expected one of {sorted(by_name)}, got {name!r}")
        topo = _topology(entry.pop("topology"), path, f"{field}.topology") if "topology" in entry else base
        settings = {Axis(k, (k,), (v,)): v for k, v in entry.items()}
        over = _overrides(topo, settings, path, field)
        shown = (("topology", topo),) + tuple(entry.items())
        points += [Point(topo, over, name, by_name[name].op, params, shown) for params in by_name[name].expand()]
    return points
