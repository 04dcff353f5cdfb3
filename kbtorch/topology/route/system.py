"""Routing on a system of chips: chip-local routes from the chip alone, then system-level.

NOTE: no route table over the whole system. A route inside one chip is the chip file's own
route (``Router`` of the chip machine, names taken relative to the chip's prefix, computed
once for every chip alike). A route between chips leaves its chip by one port group
(chip-local route to the group's ``attach`` node, then the port), crosses the system level
(a direct tray link to the peer group, or up the switch tiers to the lowest common switch and
down) and enters the other chip the same way. Of the port groups that reach the other chip,
the one with the least uncontended head latency wins (ties: file order), as in ``Router``.
A route never passes through a third chip. A split group's route uses its lane 0 (one path;
a per-packet policy may spray over ``SystemLayout.groups[g].nodes``).

Multi-path (``spray``, for ``multipath.Paths`` under a ``[routing]`` policy): the ways from
chip a to chip b are the direct crossings and the crossings through ONE relay chip c (a to
c, then c to b: c's ANC forwards the packets, as Maia's ANCs spray "along different network
paths"); each way leaves a by one of its port groups and enters b by one of b's.
``port-spray`` keeps, for every (port group of a, port group of b) pair, the way of least
head latency: every port of both chips carries part of a message. ``minimal-spray`` keeps
the ways of least head latency only. A way over split groups is one path per lane (lane i
of each group it crosses, modulo the group's lanes). Inside one chip: the chip's route.
"""
from __future__ import annotations

from ..errors import TopologyError


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

    def spray(self, src: str, dst: str, policy: str, limit: int, relays: int = 0) -> list:
        """The node paths a message from ``src`` to ``dst`` is sprayed over under ``policy``
        (``minimal-spray`` or ``port-spray``, see the module docstring), least latency first,
        at most ``limit``, through at most ``relays`` (0 or 1) other chips; [] if the two are
        on one chip (the caller takes the route)."""
        lay = self.layout
        a, b = lay.chip_of(src), lay.chip_of(dst)
        if a is None or b is None or a == b:
            return []
        ways = []                        # (ps, order, (out group, in group), path)
        for legs in self._ways(a, b, relays):
            for path in self._lanes(src, dst, legs):
                ps = sum(self.weight(u, v) for u, v in zip(path, path[1:]))
                ways.append((ps, len(ways), (legs[0][1].name, legs[-1][2].name), path))
        ways.sort(key=lambda w: w[:2])
        if policy == "minimal-spray":
            keep = [w for w in ways if w[0] == ways[0][0]]
        else:
            # NOTE: one way per (out group, in group) pair: its least-latency way, all its lanes.
            best = {}
            for w in ways:
                best.setdefault(w[2], w[0])
            keep = [w for w in ways if best[w[2]] == w[0]]
        return [w[3] for w in keep[:limit]]

    def _ways(self, a: int, b: int, relays: int):
        """Chip-level ways from a to b: tuples of legs (from chip, group out, group in, to
        chip, switches between); direct ways first, then through each relay chip in order."""
        for ga, gb, mid in self._crossings(a, b):
            yield ((a, ga, gb, b, mid),)
        if not relays:
            return
        for c in range(self.layout.chips):
            if c in (a, b):
                continue
            for ga, gc, m1 in self._crossings(a, c):
                for gc2, gb, m2 in self._crossings(c, b):
                    if gc2 is not gc:
                        yield ((a, ga, gc, c, m1), (c, gc2, gb, b, m2))

    def _lanes(self, src: str, dst: str, legs: tuple):
        """The node paths of a way, one per lane (lane i of every group, modulo its lanes)."""
        lay = self.layout
        n = max(g.lanes if g.split else 1 for leg in legs for g in leg[1:3])
        for i in range(n):
            path, at = (), src
            for c0, g0, g1, c1, mid in legs:
                p0 = lay.prefix(c0) + g0.nodes[i % len(g0.nodes)]
                p1 = lay.prefix(c1) + g1.nodes[i % len(g1.nodes)]
                path += self._to(c0, at, g0) + (p0,) + mid + (p1,)
                at = lay.prefix(c1) + g1.attach
            tail = self._from(legs[-1][3], legs[-1][2], dst)
            yield path + tail

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
