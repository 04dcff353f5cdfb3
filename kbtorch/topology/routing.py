"""Dimension-ordered shortest-path routing computed from the compiled graph with networkx.

Links made by a ``connect`` rule carry a dimension name (``x``, ``y``, ``sip``...). The
machine's ``route_order`` lists the dimensions in the order a path may use them; a hop on a
dimension listed in ``route_reset`` starts the order again (so a path may go X, Y inside a
SIP, cross the SIP ring, then X, Y in the next SIP). Links without a dimension (inside a
CUBE) may be used in any phase. Among the paths that respect the order, the one with the
least uncontended head latency (router overheads + propagation + one flit's serialisation)
wins; equal paths are broken by the graph's insertion order, so routes are deterministic.

Only ``transit`` nodes (routers, PHYs, controllers) may be intermediate hops: a path never
shortcuts through a PE's engines or a memory. This gives XY routing on meshes and tori, the
shortest direction around rings, and explicit shortest paths inside a CUBE, with no special
case per topology.
"""
from __future__ import annotations

import networkx as nx

from .errors import TopologyError


class Router:
    """Routes between any two nodes of a compiled machine graph; results are cached."""

    def __init__(self, graph: nx.DiGraph, order: list[str], reset: list[str], path: str):
        self.graph, self.order, self.reset, self.path = graph, list(order), set(reset), path
        self._product = self._build_product()
        self._trees: dict = {}
        self._routes: dict = {}

    def weight(self, u: str, v: str) -> int:
        """Head latency of hop u->v in ps: propagation + one flit + v's switching overhead."""
        e = self.graph.edges[u, v]
        return e["prop_ps"] + e["flit_ps"] + self.graph.nodes[v]["overhead_ps"]

    def _next_phase(self, phase: int, dim):
        if dim is None:
            return phase
        if dim not in self.order:
            return None
        j = self.order.index(dim)
        if j < phase:
            return None
        return 0 if dim in self.reset else j

    def _build_product(self) -> nx.DiGraph:
        g, product = self.graph, nx.DiGraph()
        transit = [n for n, d in g.nodes(data=True) if d["transit"]]
        for u in transit:
            for v in g.successors(u):
                if not g.nodes[v]["transit"]:
                    continue
                dim, w = g.edges[u, v]["dim"], self.weight(u, v)
                for p in range(len(self.order) or 1):
                    q = self._next_phase(p, dim)
                    if q is not None:
                        product.add_edge((u, p), (v, q), w=w)
        return product

    def _tree(self, start: str):
        if start not in self._trees:
            if (start, 0) in self._product:
                pred, dist = nx.dijkstra_predecessor_and_distance(self._product, (start, 0), weight="w")
            else:
                pred, dist = {(start, 0): []}, {(start, 0): 0}
            self._trees[start] = (pred, dist)
        return self._trees[start]

    def route(self, src: str, dst: str) -> tuple[str, ...]:
        """The node sequence from src to dst (both included); TopologyError if unroutable."""
        key = (src, dst)
        if key in self._routes:
            return self._routes[key]
        g = self.graph
        if src == dst:
            raise TopologyError(self.path, "route", f"source and destination are the same node '{src}'")
        best = (g.edges[src, dst]["prop_ps"] + g.edges[src, dst]["flit_ps"], (src, dst)) if g.has_edge(src, dst) else None
        ends = [(r, self.weight(r, dst)) for r in g.predecessors(dst) if g.nodes[r]["transit"]]
        for first in g.successors(src):
            if not g.nodes[first]["transit"]:
                continue
            w0 = self.weight(src, first)
            pred, dist = self._tree(first)
            for last, w1 in ends:
                for p in range(len(self.order) or 1):
                    d = dist.get((last, p))
                    if d is not None and (best is None or w0 + d + w1 < best[0]):
                        best = (w0 + d + w1, (src,) + self._walk(pred, (last, p)) + (dst,))
        if best is None:
            raise TopologyError(self.path, "route", f"no route from '{src}' to '{dst}'")
        self._routes[key] = best[1]
        return best[1]

    @staticmethod
    def _walk(pred: dict, state) -> tuple:
        nodes = []
        while True:
            nodes.append(state[0])
            if not pred[state]:
                break
            state = pred[state][0]
        return tuple(reversed(nodes))
