"""Groups of PEs for collectives, and the grid a group forms on the topology.

A group is given as ``all``, as a level of the topology's hierarchy (``cube``, ``sip``,
``device``, ...: the block array names in the PE prefixes, optionally ``cube:5`` for the
sixth instance), as a list (``"0-7,16"``) or as PE ids. Level names come from the topology
file, never from here.

The group's grid: the PE coordinates (``coords`` of the topology's grids and arrays) that
vary inside the group are its dimensions, innermost first. Along each dimension the ring
order is found greedily (next the nearest unvisited member by routed hops), so that a ring
inside an AHBM CUBE goes round its four corner routers (PEs 0 1 2 3 6 7 4 5) instead of
crossing the CUBE twice. The order of the whole group is a snake over the dimensions.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from ...topology.system import LEVELS as SYSTEM_LEVELS
from .request import CollectiveError

_LEVEL = re.compile(r"([A-Za-z_]+)(\d+)$")
#: Lines longer than this keep their coordinate order (the greedy ring order asks for a
#: route between every two members: quadratic; 1536 trays of a pod are 1.2 M routes).
GREEDY_MAX = 64


@dataclass(frozen=True)
class Grid:
    """Members (ranks 0..n-1, ``pes[rank]`` their PE ids) on a grid of ``dims`` (sizes,
    innermost first, named ``names``); ``coords[rank][j]`` is the member's ring position
    along dimension j; ``order`` is the snake ring over all members."""

    pes: tuple
    names: tuple
    dims: tuple
    coords: tuple
    order: list
    inner: int = 1          # leading dimensions inside one chip (``hier``'s first phase)

    def line(self, m: int, j: int) -> list:
        """The members that differ from ``m`` only along dimension ``j``, by ring position."""
        c = self.coords[m]
        return [self._at[c[:j] + (p,) + c[j + 1:]] for p in range(self.dims[j])]

    @cached_property
    def _at(self) -> dict:
        return {c: m for m, c in enumerate(self.coords)}


def _levels(pe) -> list:
    out = []
    for part in pe.prefix.strip(".").split("."):
        m = _LEVEL.match(part)
        if m:
            out.append((m.group(1), part))
    return out


def resolve_group(machine, spec) -> tuple:
    """PE ids of the group ``spec`` on ``machine`` (see the module docstring)."""
    n_pes = len(machine.pes)
    if isinstance(spec, str) and spec == "all":
        pes = tuple(range(n_pes))
    elif isinstance(spec, str) and re.fullmatch(r"[\d,\s-]+", spec, re.ASCII):
        pes = []
        for item in filter(None, (x.strip() for x in spec.split(","))):
            a, dash, b = item.partition("-")
            if not (a.isascii() and a.isdigit()) or (dash and not (b.isascii() and b.isdigit())):
                raise CollectiveError(f"group '{spec}': cannot read '{item}' (expected N or N-M)")
            if dash and int(b) < int(a):
                raise CollectiveError(f"group '{spec}': range '{item}' runs backwards")
            pes += range(int(a), int(b or a) + 1)
        pes = tuple(pes)
    elif isinstance(spec, str):
        pes = _level_group(machine, spec)
    else:
        pes = tuple(int(p) for p in spec)
    for p in pes:
        if not 0 <= p < n_pes:
            raise CollectiveError(f"PE {p} is outside topology '{machine.name}' (PEs 0..{n_pes - 1})")
    if len(set(pes)) != len(pes):
        raise CollectiveError(f"group {spec!r} names a PE twice")
    if len(pes) < 2:
        raise CollectiveError(f"a collective needs at least two members, group {spec!r} has {len(pes)}")
    return pes


def levels_of(machine) -> list:
    """The hierarchy levels that group PEs (``cube``, ``sip``, ``chip`` ...), outermost first."""
    return list(dict.fromkeys(lv for lv, _ in _levels(machine.pes[0])))[:-1]


def level_instances(machine, level: str) -> dict:
    """``{instance key: [PE ids]}`` of every instance of hierarchy level ``level``, in order."""
    depth = levels_of(machine).index(level) + 1
    instances: dict = {}
    for pe in machine.pes:
        instances.setdefault(tuple(part for _, part in _levels(pe)[:depth]), []).append(pe.id)
    return instances


def _level_group(machine, spec: str) -> tuple:
    name, colon, index = spec.partition(":")
    known = levels_of(machine)
    if name not in known:
        raise CollectiveError(f"unknown group '{spec}' on topology '{machine.name}' "
                              f"(known: all, {', '.join(known)}, a list like 0-7,16, or name:index)")
    instances = level_instances(machine, name)
    keys = list(instances)
    if colon and not (index.isascii() and index.isdigit()):
        raise CollectiveError(f"group '{spec}': expected an instance number after ':' "
                              f"('{name}' has instances 0..{len(keys) - 1})")
    k = int(index) if index else 0
    if k >= len(keys):
        raise CollectiveError(f"group '{spec}': '{name}' has instances 0..{len(keys) - 1}")
    return tuple(instances[keys[k]])


def _hops(machine, a: int, b: int) -> int:
    return len(machine.route(machine.pes[a].node("dma_wr"), machine.pes[b].node("dma_rd")))


def _greedy(machine, pes: list) -> list:
    """Indices into ``pes`` in nearest-neighbour order from the first."""
    left, out = list(range(1, len(pes))), [0]
    while left:
        nxt = min(left, key=lambda i: (_hops(machine, pes[out[-1]], pes[i]), i))
        out.append(nxt)
        left.remove(nxt)
    return out


def make_grid(machine, pes: tuple) -> Grid:
    """The grid of group ``pes`` (a single dimension if it is not a full grid)."""
    keys = list(machine.pes[pes[0]].coords)
    vals = {k: sorted({machine.pes[p].coords.get(k) for p in pes}) for k in keys}
    varying = [k for k in reversed(keys) if len(vals[k]) > 1]
    combos = {tuple(machine.pes[p].coords.get(k) for k in varying) for p in pes}
    size = 1
    for k in varying:
        size *= len(vals[k])
    if not varying or size != len(pes) or len(combos) != len(pes):
        # NOTE: 16 bounds the greedy ring search's cost (quadratic in members), not hardware
        order = _greedy(machine, list(pes)) if len(pes) <= 16 else list(range(len(pes)))
        coords = tuple((order.index(m),) for m in range(len(pes)))
        return Grid(tuple(pes), ("member",), (len(pes),), coords, order)
    rank = {tuple(machine.pes[p].coords[k] for k in varying): r for r, p in enumerate(pes)}
    ring_vals = []
    for j, k in enumerate(varying):
        base = {kk: machine.pes[pes[0]].coords[kk] for kk in varying}
        line = [rank[tuple(v if kk == k else base[kk] for kk in varying)] for v in vals[k]]
        near = _greedy(machine, [pes[m] for m in line]) if len(line) <= GREEDY_MAX else range(len(line))
        ring_vals.append([vals[k][i] for i in near])
    coords = tuple(tuple(ring_vals[j].index(machine.pes[p].coords[k]) for j, k in enumerate(varying)) for p in pes)
    at = {c: m for m, c in enumerate(coords)}
    dims = tuple(len(v) for v in ring_vals)
    order = [at[c] for c in _snake(dims)]
    return Grid(tuple(pes), tuple(varying), dims, coords, order, _inner(machine, pes, varying))


def _inner(machine, pes: tuple, varying: list) -> int:
    """How many of the grid's dimensions (innermost first) lie inside one chip: on a system
    whose group spans chips, those below the system's levels; else 1 (``hier``'s lines)."""
    if getattr(machine, "system", None) is None or len({machine.chip_of(p) for p in pes}) == 1:
        return 1
    return sum(1 for k in varying if k not in SYSTEM_LEVELS)


def _snake(dims: tuple) -> list:
    """All coordinates of ``dims`` (innermost first) in boustrophedon order, outermost slowest."""
    if len(dims) == 1:
        return [(p,) for p in range(dims[0])]
    inner = _snake(dims[:-1])
    out = []
    for v in range(dims[-1]):
        part = inner if v % 2 == 0 else inner[::-1]
        out += [c + (v,) for c in part]
    return out
