"""Multi-path transport: the paths a message's packets are sprayed over, chosen by the
machine's ``[routing]`` policy (docs/topology-format.md).

- ``single`` (the default): the one dimension-ordered route (``routing.Router``).
- ``minimal-spray``: every path of least uncontended head latency between the two nodes, in
  any dimension order (minimal oblivious routing: buffers are unbounded in this model, so the
  deadlock freedom dimension order buys is not needed), at most ``max_paths``.
- ``port-spray``: one path out of each of the source's ports (the nodes of kind
  ``port_kind`` the source reaches without crossing another port: "all of a chip's ports"),
  each the least-latency route from the port on, not revisiting a node; a message that
  needs no port (it stays inside the chip) takes its single route.

Each path gets packets in proportion to its bottleneck bandwidth (``weights``): a smooth
weighted round robin over the message's trains, so the order is deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

import networkx as nx

from .errors import TopologyError

POLICIES = ("single", "minimal-spray", "port-spray")
MAX_PATHS = 16


@dataclass(frozen=True)
class RoutingPolicy:
    """``policy`` (one of ``POLICIES``), the most paths a message uses, the port kind."""

    policy: str = "single"
    max_paths: int = MAX_PATHS
    port_kind: str | None = None

    @classmethod
    def from_doc(cls, doc: dict | None, graph, path: str) -> "RoutingPolicy":
        doc = doc or {}
        policy = doc.get("policy", "single")
        if policy not in POLICIES:
            raise TopologyError(path, "routing.policy", f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
        kind = doc.get("port_kind")
        if policy == "port-spray":
            if kind is None:
                raise TopologyError(path, "routing.port_kind", "policy 'port-spray' needs port_kind (the component "
                                    "kind of a chip's network ports, e.g. \"nic\")")
            if not any(d["kind"] == kind for _, d in graph.nodes(data=True)):
                raise TopologyError(path, "routing.port_kind", f"no node is of kind {kind!r}")
        return cls(policy, doc.get("max_paths", MAX_PATHS), kind)


class Paths:
    """The paths between two nodes under a policy (cached), with their weights."""

    def __init__(self, router, policy: RoutingPolicy):
        self.router, self.policy, self.graph = router, policy, router.graph
        self._cache: dict = {}
        self._transit = None

    def paths(self, src: str, dst: str) -> tuple:
        """``((path, weight), ...)``: the node paths a message from ``src`` to ``dst`` is
        sprayed over and each one's share of its packets (bottleneck GB/s)."""
        key = (src, dst)
        got = self._cache.get(key)
        if got is None:
            single = self.router.route(src, dst)
            if self.policy.policy == "minimal-spray":
                found = self._minimal(src, dst)
            elif self.policy.policy == "port-spray":
                found = self._ports(src, dst, single)
            else:
                found = []
            found = list(dict.fromkeys(found)) or [single]
            got = self._cache[key] = tuple((p, self._bottleneck(p)) for p in found[: self.policy.max_paths])
        return got

    def _bottleneck(self, path: tuple) -> float:
        g = self.graph
        return min(g.edges[u, v]["bw_gbps"] for u, v in zip(path, path[1:]))

    def _view(self, src: str, dst: str, avoid=()) -> nx.DiGraph:
        g = self.graph
        if self._transit is None:
            self._transit = {n for n, d in g.nodes(data=True) if d["transit"]}
        keep = (self._transit | {src, dst}) - set(avoid)
        return g.subgraph(keep)

    def _weight(self, u: str, v: str, d: dict) -> int:
        return self.router.weight(u, v)

    def _minimal(self, src: str, dst: str) -> list:
        view = self._view(src, dst)
        # NOTE: a path never leaves src back into it nor passes dst (both are endpoints).
        try:
            found = nx.all_shortest_paths(view, src, dst, weight=self._weight)
            return [tuple(p) for p in islice(found, self.policy.max_paths)]
        except nx.NetworkXNoPath:
            return []

    def ports(self, src: str) -> list:
        """The port nodes ``src`` reaches without crossing another port (graph order)."""
        g, kind = self.graph, self.policy.port_kind
        seen, todo, out = {src}, [src], []
        while todo:
            u = todo.pop(0)
            for v in g.successors(u):
                if v in seen or not g.nodes[v]["transit"]:
                    continue
                seen.add(v)
                if g.nodes[v]["kind"] == kind:
                    out.append(v)
                else:
                    todo.append(v)
        return out

    def _ports(self, src: str, dst: str, single: tuple) -> list:
        kind = self.policy.port_kind
        if not any(self.graph.nodes[v]["kind"] == kind for v in single[1:-1]):
            return [single]
        out = []
        for port in self.ports(src):
            try:
                lead = nx.shortest_path(self._view(src, port), src, port, weight=self._weight)
                rest = nx.shortest_path(self._view(port, dst, avoid=lead[:-1]), port, dst, weight=self._weight)
            except nx.NetworkXNoPath:
                continue
            out.append(tuple(lead) + tuple(rest[1:]))
        out.sort(key=lambda p: sum(self.router.weight(u, v) for u, v in zip(p, p[1:])))
        return out
