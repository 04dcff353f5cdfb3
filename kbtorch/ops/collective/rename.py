"""One line's collective programs renamed to another line of PEs (``build.build_lines``).

The lines of a collective across units (``across:chip:K``) run the same schedule on the
same share, each on its own PEs: line ``t`` is PE ``t`` of every chip. The kernel's
commands for a line depend on the schedule, the share, and on each member PE's own
hardware and memories (its TCM, its HBM): the buffers are allocated the same way on every
line, so line ``b``'s programs are line ``a``'s with every PE id and every node of a
member's PE renamed member by member.

``programs`` renames only when that holds, else returns None (build the line): the two
lines form grids of the same shape (so the same schedule, member by member), each member
pair has identical PE hardware (``sim.symmetry.hardware``) and HBM and SRAM nodes of the
same kind and parameters (one chip's shared HBM maps to itself, a PE's own slice to the
other PE's), and every node the commands name is inside a member's PE or one of those
memories. NOTE: the kernel's multicast grouping depends on routes, which differ between
lines: a line where one of the groupings the kernel asked would come out otherwise
(``multicast``: ``CollectiveKernel.multicasts_alike`` is false) is never renamed.
"""
from __future__ import annotations

from ...kernel.door import Composite, Compute, Dma, Fetch, Loc, Move, Multicast, Send, Share, Store, hardware


def _node(machine, node: str) -> tuple:
    d = machine.graph.nodes[node]
    return d["kind"], d["overhead_ps"], repr(d.get("params"))


def _shape(grid) -> tuple:
    return grid.names, grid.dims, grid.coords, tuple(grid.order), grid.inner


class _Refused(Exception):
    """A node or command the renaming cannot account for."""


def _with(x, **changes):
    """``x`` (a frozen dataclass, already checked) with ``changes``, not validated again."""
    y = object.__new__(type(x))
    y.__dict__.update(x.__dict__)
    y.__dict__.update(changes)
    return y


class _Renamer:
    """Commands of line ``a`` on line ``b``: PE ids by ``pe_map``, member nodes by prefix."""

    def __init__(self, pe_map: dict, node_map: dict, prefixes: list):
        self.pe_map, self.node_map, self.locs = pe_map, node_map, {}
        self.by_first: dict = {}
        for pa, pb in prefixes:
            self.by_first.setdefault(pa.split(".", 1)[0], []).append((pa, pb))
        self.handlers = {Dma: self._dma, Multicast: self._multicast, Composite: self._composite, Send: self._send,
                         Compute: self._plain, Fetch: self._plain, Store: self._plain}

    def node(self, n: str) -> str:
        got = self.node_map.get(n)
        if got is None:
            for pa, pb in self.by_first.get(n.split(".", 1)[0], ()):
                if n.startswith(pa):
                    got = self.node_map[n] = pb + n[len(pa):]
                    break
            else:
                raise _Refused(n)
        return got

    def loc(self, x: Loc) -> Loc:
        got = self.locs.get(x)
        if got is None:
            got = self.locs[x] = Loc(self.node(x.node), x.addr)
        return got

    def move(self, m: Move) -> Move:
        share = None if m.share is None else Share(m.share.key, tuple(self.pe_map[p] for p in m.share.pes))
        return _with(m, loc=self.loc(m.loc), share=share)

    def notify(self, c) -> tuple:
        return tuple((self.pe_map[p], s) for p, s in c.notify)

    def _dma(self, c):
        return _with(c, src=self.loc(c.src), dst=self.loc(c.dst), notify=self.notify(c))

    def _multicast(self, c):
        return _with(c, src=self.loc(c.src), dsts=tuple(self.loc(d) for d in c.dsts), notify=self.notify(c))

    def _composite(self, c):
        return _with(c, staging=self.loc(c.staging), reads=tuple(self.move(m) for m in c.reads),
                     writes=tuple(self.move(m) for m in c.writes), notify=self.notify(c))

    def _send(self, c):
        return _with(c, dst_pe=self.pe_map[c.dst_pe], notify=self.notify(c))

    def _plain(self, c):
        return _with(c, notify=self.notify(c)) if c.notify else c

    def command(self, c):
        handler = self.handlers.get(type(c))
        if handler is None:
            raise _Refused(type(c).__name__)
        return handler(c)


def _maps(machine, line_a: tuple, line_b: tuple):
    """(PE map, node map of the memories outside the PEs, PE prefix pairs), or None."""
    node_map, prefixes = {}, []
    for a, b in zip(line_a, line_b):
        pa, pb = machine.pes[a], machine.pes[b]
        if hardware(machine, pa.prefix) != hardware(machine, pb.prefix):
            return None
        prefixes.append((pa.prefix, pb.prefix))
        for level in ("hbm", "sram"):
            na, nb = getattr(pa, level, None), getattr(pb, level, None)
            if (na is None) != (nb is None) or (na is not None and na.startswith(pa.prefix)):
                return None
            if na is not None and (node_map.setdefault(na, nb) != nb or _node(machine, na) != _node(machine, nb)):
                return None
    return dict(zip(line_a, line_b)), node_map, prefixes


def programs(machine, progs: dict, grid_a, grid_b, multicast: bool = False) -> dict | None:
    """``progs`` (``{pe: [commands]}`` of the members of ``grid_a``) on the members of
    ``grid_b``, or None. The two grids must have the same shape (dimensions, ring order)."""
    line_a, line_b = grid_a.pes, grid_b.pes
    if multicast or len(line_a) != len(line_b) or _shape(grid_a) != _shape(grid_b):
        return None
    maps = _maps(machine, line_a, line_b)
    if maps is None:
        return None
    r = _Renamer(*maps)
    try:
        return {r.pe_map[pe]: [r.command(c) for c in cmds] for pe, cmds in progs.items()}
    except (_Refused, KeyError):
        return None
