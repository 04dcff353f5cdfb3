"""Routing on a system of chips: chip-local routes from the chip alone, then system-level.

NOTE: no route table over the whole system. A route inside one chip is the chip file's own
route (``Router`` of the chip machine, names taken relative to the chip's prefix, computed
once for every chip alike). A route between chips leaves its chip by one port group
(chip-local route to the group's ``attach`` node, then the port), crosses the system level
(a direct tray link to the peer group, or up the switch tiers to the lowest common switch and
down) and enters the other chip the same way. Of the port groups that reach the other chip,
the one with the least uncontended head latency wins (ties: file order), as in ``Router``.
A route never passes through a third chip. A split group's route uses its lane 0 (one path;
a per-packet policy may spray over ``Layout.groups[g].nodes``).
"""
from __future__ import annotations

from .errors import TopologyError


class SystemRouter:
    """Routes between any two nodes of a system machine (``Router``'s interface)."""

    def __init__(self, graph, chip_router, layout, path: str):
        self.graph, self.chip, self.layout, self.path = graph, chip_router, layout, path
        self._routes: dict = {}

    def weight(self, u: str, v: str) -> int:
        """Head latency of hop u->v in ps: propagation + one flit + v's switching overhead."""
        e = self.graph.edges[u, v]
        return e["prop_ps"] + e["flit_ps"] + self.graph.nodes[v]["overhead_ps"]

    def route(self, src: str, dst: str) -> tuple[str, ...]:
        """The node sequence from src to dst (both included); TopologyError if unroutable."""
        key = (src, dst)
        hit = self._routes.get(key)
        if hit is None:
            hit = self._routes[key] = self._route(src, dst)
        return hit

    def _route(self, src: str, dst: str) -> tuple[str, ...]:
        lay = self.layout
        a, b = lay.chip_of(src), lay.chip_of(dst)
        for node in (src, dst):
            if node not in self.graph:
                raise TopologyError(self.path, "route", f"no node '{node}'")
        if a is not None and a == b:
            return self._local(a, src, dst)
        if a is None or b is None:
            raise TopologyError(self.path, "route", f"no route from '{src}' to '{dst}': routes run between the "
                                "nodes of chips")
        best = None
        for ga, gb, middle in self._crossings(a, b):
            pa, pb = lay.prefix(a) + ga.nodes[0], lay.prefix(b) + gb.nodes[0]
            path = (self._to(a, src, ga) + (pa,) + middle + (pb,) + self._from(b, gb, dst))
            ps = sum(self.weight(u, v) for u, v in zip(path, path[1:]))
            if best is None or ps < best[0]:
                best = (ps, path)
        if best is None:
            raise TopologyError(self.path, "route", f"no route from '{src}' (chip {a}) to '{dst}' (chip {b})")
        return best[1]

    def _crossings(self, a: int, b: int):
        """(group of a, group of b, switch nodes between) for each way from chip a to chip b."""
        lay = self.layout
        if a // lay.per_tray == b // lay.per_tray:
            pair = lay.direct.get((a % lay.per_tray, b % lay.per_tray))
            if pair:
                yield lay.groups[pair[0]], lay.groups[pair[1]], ()
        if lay.tiers:
            up, down = lay.switches(a), lay.switches(b)
            k = next(i for i in range(len(up)) if up[i] == down[i])
            g = lay.groups[lay.tiers[0].down]
            yield g, g, up[:k + 1] + tuple(reversed(down[:k]))

    def _local(self, chip: int, src: str, dst: str) -> tuple:
        prefix = self.layout.prefix(chip)
        n = len(prefix)
        return tuple(prefix + x for x in self.chip.route(src[n:], dst[n:]))

    def _to(self, chip: int, src: str, group) -> tuple:
        """Chip-local route from ``src`` to the group's attach node (``(src,)`` if it is it)."""
        attach = self.layout.prefix(chip) + group.attach
        return (src,) if src == attach else self._local(chip, src, attach)

    def _from(self, chip: int, group, dst: str) -> tuple:
        attach = self.layout.prefix(chip) + group.attach
        return (dst,) if dst == attach else self._local(chip, attach, dst)
