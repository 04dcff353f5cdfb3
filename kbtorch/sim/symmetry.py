"""Symmetry reduction: simulate one representative of each class of identical, independent units.

Many kernels (elementwise passes, GEMMs without a K split, attention with heads mapped to
PEs) run the same program on every block of the machine, each block touching only its own
memories, routers and links. Such a run is the same run repeated: simulating one block per
class of identical blocks gives exactly the latency, attribution and counters of the whole.

``reduce(machine, programs)`` looks for the smallest level of the PEs' name hierarchy (the
prefixes of the topology file, e.g. a PE, then its CUBE, then its SIP) at which

1. every path a PE's commands use (DMA and composite data paths, IPCQ sends) and every PE
   it sends to or notifies lies inside its own unit at that level, and
2. units fall into classes whose members have identical programs, identical hardware and
   identical kernel-launch times relative to the unit's first launch, once their names are
   taken relative to the unit's prefix.

It returns a ``Reduction`` with the representatives' programs (the first unit of each class)
and the multiplicity of every node, so the run's counters can be scaled back
(``Simulator(weight=...)``) and per-PE and per-memory results copied to every member
(``expand``). Without such a level the programs are returned unchanged.

NOTE: units at the chosen level share no resource (condition 1 includes every node and link
on every path), so the runs of two members of a class are the same run under renaming, and
a member launched later than another runs the same run shifted by the difference. The
representative of a class is its member launched last, so the whole run's latency is the
maximum over the classes' representatives, and its chain is a representative's own; other
members' finishes are the representative's shifted back. The trace of a reduced run holds
the representatives only.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from bisect import bisect_left
from functools import lru_cache

from .commands import Composite, Compute, Dma, Fetch, Loc, Multicast, Send, Store
from .components.dma import data_path, data_paths
from .registry import Registry
from .. import state

#: What each command type uses: ``handler(machine, info, cmd, keys, peers)`` adds the node
#: paths it moves data on (``("data" | "route", src, dst)``) to ``keys`` and the PEs it sends
#: to to ``peers`` (``info``: the issuing PE).
PATHS = Registry("symmetry paths")


@dataclass(frozen=True)
class Reduction:
    """Programs of the representative units and how to scale their results back."""

    programs: dict
    members: dict          # representative unit prefix -> every member prefix of its class
    shift_ps: dict = field(default_factory=dict)   # member prefix -> its launch minus its representative's

    @property
    def reduced(self) -> bool:
        return any(len(m) > 1 for m in self.members.values())

    def weight(self, node: str) -> int:
        """How many units a node of a representative stands for (1 outside any unit)."""
        for prefix, members in self.members.items():
            if node.startswith(prefix):
                return len(members)
        return 1

    def expand(self, result, machine):
        """Copy per-PE finishes and per-memory counters of each representative to its class."""
        if not self.reduced:
            return result
        pe_of = {pe.prefix: pe.id for pe in machine.pes}
        finish = {}
        for rep, members in self.members.items():
            for member in members:
                for pe, t in result.pe_finish_ps.items():
                    prefix = machine.pes[pe].prefix
                    if prefix.startswith(rep):
                        finish[pe_of[member + prefix[len(rep):]]] = t + self.shift_ps.get(member, 0)
        result.pe_finish_ps = dict(sorted(finish.items()))
        for stats in (result.stats, *result.mark_stats.values()):
            stats["memories"] = self._memories(stats["memories"])
        result.stats["represented_units"] = sum(len(m) for m in self.members.values())
        return result

    def _memories(self, counters: dict) -> dict:
        """Each representative memory's counters copied to its class's memories."""
        mems = {}
        for rep, members in self.members.items():
            for member in members:
                for node, s in counters.items():
                    if node.startswith(rep):
                        mems[member + node[len(rep):]] = s
        return dict(sorted(mems.items()))


def _levels(prefix: str) -> list[str]:
    """``"a0.b1.c2."`` -> ``["a0.b1.c2.", "a0.b1.", "a0."]`` (innermost first)."""
    parts = prefix.rstrip(".").split(".")
    return [".".join(parts[:i]) + "." for i in range(len(parts), 0, -1)]


@PATHS.register(Dma)
def _dma(machine, info, cmd, keys: set, peers: set) -> None:
    keys.add(("data", cmd.src.node, cmd.dst.node))


@PATHS.register(Multicast)
def _multicast(machine, info, cmd, keys: set, peers: set) -> None:
    keys.update(("data", cmd.src.node, d.node) for d in cmd.dsts)


@PATHS.register(Composite)
def _composite(machine, info, cmd, keys: set, peers: set) -> None:
    tcm = info.node("tcm")
    keys.update(("data", m.loc.node, tcm) for m in cmd.reads)
    for m in cmd.reads:
        if m.share is not None:
            # NOTE: a shared read reaches every member of its gang (and waits for them).
            peers.update(m.share.pes)
            keys.update(("data", m.loc.node, machine.pes[p].node("tcm")) for p in m.share.pes)
    keys.update(("data", tcm, m.loc.node) for m in cmd.writes)


@PATHS.register(Send)
def _send(machine, info, cmd, keys: set, peers: set) -> None:
    peers.add(cmd.dst_pe)
    keys.add(("route", info.node("ipcq"), machine.pes[cmd.dst_pe].node("ipcq")))


@PATHS.register(Compute, Fetch, Store)
def _inside(machine, info, cmd, keys: set, peers: set) -> None:
    """NOTE: compute, fetch and store stay inside their PE (its engines and TCM links)."""


def _paths(machine, pe: int, cmds) -> tuple[set, set]:
    """(node paths, peer PEs) that PE ``pe``'s commands use."""
    info = machine.pes[pe]
    keys, peers = set(), set()
    for cmd in cmds:
        PATHS[type(cmd)](machine, info, cmd, keys, peers)
        peers.update(p for p, _ in cmd.notify)
    return keys, peers


@state.cache


@lru_cache(maxsize=65536)
def _path(machine, key: tuple) -> tuple:
    """The node paths of ``key``: one, or every path of a sprayed transfer."""
    kind, src, dst = key
    if kind != "data":
        return (machine.route(src, dst),)
    return tuple(p for p, _ in data_paths(machine, src, dst)) if machine.multipath else (data_path(machine, src, dst),)


def _units(machine, programs: dict, level: int, scan) -> dict | None:
    """``{unit prefix: (PEs, node paths used)}`` at ``level``, or None if two units share a
    node or a PE signals outside its unit (``scan(pe)``: the PE's path keys and peers,
    ``_paths``, memoised across levels)."""
    units: dict = {}
    for pe in programs:
        unit = _levels(machine.pes[pe].prefix)[level]
        if any(not machine.pes[p].prefix.startswith(unit) for p in scan(pe)[1]):
            return None
        units.setdefault(unit, ([], set()))[0].append(pe)
    owner: dict = {}
    for unit, (pes, paths) in units.items():
        for pe in pes:
            for key in scan(pe)[0]:
                paths.update(_path(machine, key))
        for node in {n for path in paths for n in path}:
            if owner.setdefault(node, unit) != unit:
                return None
            # NOTE: a unit prefix ends with a dot, so a node inside another unit has that
            # unit among its own dotted prefixes.
            if any(p != unit and p in units for p in _dotted(node)):
                return None
    return units


@state.cache


@lru_cache(maxsize=65536)
def _dotted(node: str) -> tuple:
    """``"a0.b1.c"`` -> ``("a0.", "a0.b1.")``: the prefixes a unit can have."""
    return tuple(node[:i + 1] for i, ch in enumerate(node) if ch == ".")


def _namer(unit: str):
    """Node names relative to ``unit``; a node outside it relative to the innermost level
    of the unit that holds it (``^1:pcie_e``), else absolute."""
    outer = _levels(unit)[1:]
    seen: dict = {}

    def rel(node: str) -> str:
        # NOTE: memoised: a unit's commands name few nodes, many times each.
        got = seen.get(node)
        if got is None:
            got = seen[node] = _relative(node, unit, outer)
        return got
    return rel


def _relative(node: str, unit: str, outer: list) -> str:
    if node.startswith(unit):
        return node[len(unit):]
    for i, prefix in enumerate(outer, 1):
        if node.startswith(prefix):
            return f"^{i}:{node[len(prefix):]}"
    return f"/{node}"


_PLAIN = (int, float, str, bool, type(None))
_FIELDS: dict = state.cache({}, "kbtorch.sim.symmetry._FIELDS")      # dataclass type -> its field names


def _canon(x, rel, rel_pe):
    """A hashable form of a command with node names and PE ids relative to its unit."""
    t = type(x)
    if t in _PLAIN:
        return x
    if t is Loc:
        return ("loc", rel(x.node), x.addr)
    if t is tuple:
        return tuple([v if type(v) in _PLAIN else _canon(v, rel, rel_pe) for v in x])
    names = _FIELDS.get(t)
    if names is None:
        if not is_dataclass(x):
            return tuple(_canon(v, rel, rel_pe) for v in x) if isinstance(x, tuple) else x
        names = _FIELDS[t] = tuple(f.name for f in fields(x))
    out = [t.__name__]
    for name in names:
        v = getattr(x, name)
        if name == "dst_pe":
            v = rel_pe(v)
        elif name == "notify":
            v = tuple((rel_pe(p), s) for p, s in v)
        elif name == "pes":     # a shared read's gang (``Share``)
            v = tuple(rel_pe(p) for p in v)
        # NOTE: plain values inline: most fields are (a call each would double the cost).
        out.append(v if type(v) in _PLAIN else _canon(v, rel, rel_pe))
    return tuple(out)


@state.cache


@lru_cache(maxsize=4096)
def hardware(machine, unit: str) -> tuple:
    """The nodes and links inside ``unit``, named relative to it."""
    g = machine.graph
    n = len(unit)
    names = _names(machine)
    inside = names[bisect_left(names, unit):bisect_left(names, unit[:-1] + chr(ord(unit[-1]) + 1))]
    nodes = tuple(sorted((v[n:], g.nodes[v]["kind"], g.nodes[v]["overhead_ps"], repr(g.nodes[v].get("params")))
                         for v in inside))
    edges = tuple(sorted((u[n:], v[n:], d["flit_ps"], d["prop_ps"], d["kind"])
                         for u in inside for v, d in g.adj[u].items() if v.startswith(unit)))
    return nodes, edges


@state.cache


@lru_cache(maxsize=8)
def _names(machine) -> list:
    """The machine's node names, sorted (those with one prefix are a slice)."""
    return sorted(machine.graph.nodes)


def _routes(machine, unit: str, paths: set, rel) -> tuple:
    """The unit's paths, relative names, with the nodes and hops outside it described."""
    g = machine.graph
    out = []
    for path in paths:
        hops = tuple((rel(u), g.edges[u, v]["flit_ps"], g.edges[u, v]["prop_ps"]) for u, v in zip(path, path[1:]))
        outside = tuple((rel(v), g.nodes[v]["kind"], g.nodes[v]["overhead_ps"], repr(g.nodes[v].get("params")))
                        for v in path if not v.startswith(unit))
        out.append((tuple(rel(v) for v in path), hops, outside))
    return tuple(sorted(out))


def _scanner(machine, programs: dict):
    """``scan(pe)``: PE ``pe``'s path keys and peers (``_paths``), memoised across levels."""
    scanned: dict = {}

    def scan(pe):
        got = scanned.get(pe)
        if got is None:
            got = scanned[pe] = _paths(machine, pe, programs[pe])
        return got
    return scan


def reduce(machine, programs: dict) -> Reduction:
    """Programs of one representative unit per class (see the module docstring)."""
    whole = Reduction(programs, {})
    if len(programs) < 2:
        return whole
    depth = min(len(_levels(machine.pes[pe].prefix)) for pe in programs)
    scan = _scanner(machine, programs)
    units = None
    for level in range(depth):
        units = _units(machine, programs, level, scan)
        if units is not None:
            break
    if units is None or len(units) < 2:
        # NOTE: one unit is a class of one: nothing to reduce, and no signature to compute
        # (a ring over one SIP's 128 PEs canonicalised its half a million commands for nothing).
        return whole
    classes: dict = {}
    base: dict = {}
    for unit, (pes, paths) in units.items():
        rel = _namer(unit)

        def rel_pe(p, rel=rel):
            return rel(machine.pes[p].prefix)

        # NOTE: members of a class must start at the same times relative to their first
        # launch (kernel launch); a whole unit launched later runs the same run shifted.
        starts = [machine.launch_ps(pe) for pe in sorted(pes)]
        base[unit] = min(starts)
        sig = (hardware(machine, unit), _routes(machine, unit, paths, rel),
               tuple(t - base[unit] for t in starts),
               tuple((rel_pe(pe), tuple(_canon(c, rel, rel_pe) for c in programs[pe])) for pe in sorted(pes)))
        classes.setdefault(sig, []).append(unit)
    # NOTE: the representative is the member launched last (the first such in name order),
    # so the class's latest finish, and its chain, are the representative's own.
    members = {max(g, key=base.__getitem__): tuple(g) for g in classes.values()}
    shift = {m: base[m] - base[rep] for rep, group in members.items() for m in group}
    reps = {pe: programs[pe] for unit in members for pe in units[unit][0]}
    return Reduction(reps, members, shift)


def images(machine, programs: dict, groups: list) -> Reduction | None:
    """``reduce``'s answer, without reading the copies, for a run of ``groups`` (lists of PEs,
    the first ``programs``' own) in which every other group runs ``programs`` renamed onto its
    PEs, position by position, as the caller built them (``ops.collective.rename``); None if
    the first group is not alone in a unit or the others' units differ from its.

    Checked as ``reduce`` checks, and stricter: at the smallest level where the first group's
    paths and peers stay inside one unit, every node on those paths is inside it too; every
    group fills a unit of its own at the same names; the units' hardware and launch offsets
    are equal. NOTE: only the copies' commands are taken on trust. Canonicalising all of them
    is what ``reduce`` spends its time on: as long as simulating 8 chips' in-chip 32 MiB
    reduce-scatter on the one chip it reduces to."""
    if len(groups) < 2 or sorted(programs) != sorted(groups[0]):
        return None
    scan = _scanner(machine, programs)
    for level in range(min(len(_levels(machine.pes[pe].prefix)) for pe in programs)):
        found = _units(machine, programs, level, scan)
        if found is not None and len(found) == 1:
            rep, (_, paths) = next(iter(found.items()))
            if all(n.startswith(rep) for path in paths for n in path):
                return _copies(machine, programs, rep, groups, level)
    return None


def _copies(machine, programs: dict, rep: str, groups: list, level: int) -> Reduction | None:
    """The reduction to ``rep`` (the first group's unit at ``level``) if every group fills its
    own unit as the first fills ``rep``, on equal hardware with equal launch offsets."""
    names = [machine.pes[pe].prefix[len(rep):] for pe in groups[0]]
    offsets = None
    units, base = [], {}
    for pes in groups:
        unit = _levels(machine.pes[pes[0]].prefix)[level]
        if unit in base or [machine.pes[pe].prefix for pe in pes] != [unit + n for n in names] \
                or hardware(machine, unit) != hardware(machine, rep):
            return None
        starts = [machine.launch_ps(pe) for pe in pes]
        base[unit] = min(starts)
        rel = [t - base[unit] for t in starts]
        if offsets is None:
            offsets = rel
        elif rel != offsets:
            return None
        units.append(unit)
    # NOTE: ``reduce``'s representative is the member launched last (the first in order).
    if max(units, key=base.__getitem__) != rep:
        return None
    return Reduction(programs, {rep: tuple(units)}, {u: base[u] - base[rep] for u in units})
