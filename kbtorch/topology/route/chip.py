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

from ..errors import TopologyError


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

    def reach(self, targets) -> "Reach":
        """Which of ``targets`` (nodes) a route can get to from each network node."""
        return Reach(self, targets)

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


class Reach:
    """Reachability of a set of target nodes from every state of the routing product graph.

    NOTE: one pass for all sources instead of one Dijkstra per source: the product graph is
    condensed into strongly connected components (a mesh row in the X phase, a column in
    the Y phase, a whole ring...), and each component's reachable targets are a bitset,
    the OR of its own and its successors', filled in reverse topological order. Linear in
    the graph (times bitset width), where a search per PE was quadratic in the PE count.
    """

    def __init__(self, router: Router, targets):
        self.router = router
        self.bit = {t: 1 << i for i, t in enumerate(dict.fromkeys(targets))}
        dag = nx.condensation(router._product)
        self.component = dag.graph["mapping"]           # product state -> component
        self.bits: dict = {}
        for c in reversed(list(nx.topological_sort(dag))):
            own = 0
            for node, _ in dag.nodes[c]["members"]:
                own |= self.bit.get(node, 0)
            for d in dag.successors(c):
                own |= self.bits[d]
            self.bits[c] = own

    def mask(self, nodes) -> int:
        """The bitset of those of ``nodes`` that are targets."""
        out = 0
        for n in nodes:
            out |= self.bit.get(n, 0)
        return out

    def from_node(self, first: str) -> int:
        """Targets reachable from transit node ``first`` entered in phase 0 (like Router._tree)."""
        state = (first, 0)
        return self.bits[self.component[state]] if state in self.component else self.bit.get(first, 0)

    def routable(self, src: str, dst: str) -> bool:
        """Whether Router.route(src, dst) finds a route; dst's transit predecessors must be targets."""
        g = self.router.graph
        if src == dst:
            return False
        if g.has_edge(src, dst):
            return True
        ends = self.mask(r for r in g.predecessors(dst) if g.nodes[r]["transit"])
        return any(self.from_node(t) & ends for t in g.successors(src) if g.nodes[t]["transit"])
