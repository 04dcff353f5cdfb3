"""Multi-path transport: the paths a message's packets are sprayed over, chosen by the
machine's ``[routing]`` policy (docs/topology-format.md).

- ``single`` (the default): the one dimension-ordered route (``route.chip.Router``).
- ``minimal-spray``: every path of least uncontended head latency between the two nodes, in
  any dimension order (minimal oblivious routing: buffers are unbounded in this model, so the
  deadlock freedom dimension order buys is not needed), at most ``max_paths``.
- ``port-spray``: one path out of each of the source's ports (the nodes of kind
  ``port_kind`` the source reaches without crossing another port: "all of a chip's ports"),
  each the least-latency route from the port on, not revisiting a node; a message that
  needs no port (it stays inside the chip) takes its single route.

On a system of chips (``route.system.SystemRouter``) both policies spray between chips over
the chips' port groups: over the tray link and the switch tiers, and with ``relays = 1``
through one other chip too (``SystemRouter.spray``).

``adaptive = true`` (congestion-aware spraying, as ATLv2's entropies recycled from
known-good paths, REPS): a packet also counts the traffic of other messages already
committed on each path's links (``sim.network.Network._pick``).

Each path's weight is its bottleneck bandwidth, a link shared by ``k`` of the message's paths
counting a ``k``-th of its bandwidth for each (so that paths that leave by one port do not
each claim all of it; a link all of them cross is left out: it limits the message, not how
it splits); the network sends each packet (train) on
the path where it would arrive first (``sim.network.Network.message``), and the models load
each path by its share of the bandwidth.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

POLICIES = ("single", "minimal-spray", "port-spray")
MAX_PATHS = 16


@dataclass(frozen=True)
class RoutingPolicy:
    """``policy`` (one of ``POLICIES``), the most paths a message uses, the port kind, and
    ``adaptive``: a packet also sees the traffic other messages committed on each path;
    ``relays``: on a system of chips, how many other chips a way may cross (0 or 1)."""

    policy: str = "single"
    max_paths: int = MAX_PATHS
    port_kind: str | None = None
    adaptive: bool = False
    relays: int = 0

    @classmethod
    def from_doc(cls, doc: dict | None) -> "RoutingPolicy":
        """The policy of a ``[routing]`` section (checked: ``validate.check_routing``)."""
        doc = doc or {}
        return cls(doc.get("policy", "single"), doc.get("max_paths", MAX_PATHS), doc.get("port_kind"),
                   bool(doc.get("adaptive", False)), doc.get("relays", 0))


class Paths:
    """The paths between two nodes under a policy (cached), with their weights."""

    def __init__(self, router, policy: RoutingPolicy):
        self.router, self.policy, self.graph = router, policy, router.graph
        self._cache: dict = {}
        self._search: dict = {}
        self._transit = None

    def paths(self, src: str, dst: str) -> tuple:
        """``((path, weight), ...)``: the node paths a message from ``src`` to ``dst`` is
        sprayed over and each one's share of its packets (bottleneck GB/s)."""
        key = (src, dst)
        got = self._cache.get(key)
        if got is None:
            single = self.router.route(src, dst)
            if self.policy.policy != "single" and hasattr(self.router, "spray"):
                # NOTE: a system of chips sprays over its chips' port groups and relay chips
                # (``route.system.SystemRouter.spray``), not over a search of the whole graph.
                found = self.router.spray(src, dst, self.policy.policy, self.policy.max_paths, self.policy.relays)
            elif self.policy.policy == "minimal-spray":
                found = self._minimal(src, dst)
            elif self.policy.policy == "port-spray":
                found = self._ports(src, dst, single)
            else:
                found = []
            found = (list(dict.fromkeys(found)) or [single])[: self.policy.max_paths]
            got = self._cache[key] = tuple(zip(found, self._shares(found)))
        return got

    def _shares(self, paths: list) -> list:
        """Each path's weight: its bottleneck bandwidth, a link that ``k`` of the paths cross
        counting ``bw / k`` (the paths of one message share it), links all cross left out."""
        g, uses = self.graph, {}
        for p in paths:
            for e in zip(p, p[1:]):
                uses[e] = uses.get(e, 0) + 1
        # NOTE: a link every path crosses (the source's own port) limits the message, not its split.
        every = len(paths) if len(paths) > 1 else 0
        return [min((g.edges[e]["bw_gbps"] / uses[e] for e in zip(p, p[1:]) if uses[e] != every),
                    default=min(g.edges[e]["bw_gbps"] for e in zip(p, p[1:]))) for p in paths]

    def _from(self, node: str) -> tuple:
        """(predecessors, distances) of every transit node from transit ``node`` over the
        transit nodes only (cached: one search per node, shared by every pair)."""
        got = self._search.get(node)
        if got is None:
            if self._transit is None:
                g = self.graph
                self._transit = g.subgraph([n for n, d in g.nodes(data=True) if d["transit"]])
            got = self._search[node] = nx.dijkstra_predecessor_and_distance(self._transit, node, weight=self._weight)
        return got

    def _weight(self, u: str, v: str, d: dict) -> int:
        return self.router.weight(u, v)

    def _ends(self, src: str, dst: str):
        """(first transit hop, its cost) out of ``src``, (last transit hop, its cost) into ``dst``."""
        g, w = self.graph, self.router.weight
        firsts = [(f, w(src, f)) for f in g.successors(src) if g.nodes[f]["transit"]] \
            if not g.nodes[src]["transit"] else [(src, 0)]
        lasts = [(r, w(r, dst)) for r in g.predecessors(dst) if g.nodes[r]["transit"]] \
            if not g.nodes[dst]["transit"] else [(dst, 0)]
        return firsts, lasts

    def _minimal(self, src: str, dst: str) -> list:
        firsts, lasts = self._ends(src, dst)
        best, pairs = None, []
        for f, w0 in firsts:
            _, dist = self._from(f)
            for r, w1 in lasts:
                if r in dist:
                    c = w0 + dist[r] + w1
                    if best is None or c < best:
                        best, pairs = c, [(f, r)]
                    elif c == best:
                        pairs.append((f, r))
        out = []
        for f, r in pairs:
            pred, _ = self._from(f)
            for mid in _walks(pred, r, self.policy.max_paths - len(out)):
                out.append(_join(src, mid, dst))
            if len(out) >= self.policy.max_paths:
                break
        return out

    def _one(self, src: str, dst: str):
        """The least-latency path from ``src`` to ``dst`` through transit nodes, or None."""
        firsts, lasts = self._ends(src, dst)
        best = None
        for f, w0 in firsts:
            pred, dist = self._from(f)
            for r, w1 in lasts:
                if r in dist and (best is None or w0 + dist[r] + w1 < best[0]):
                    best = (w0 + dist[r] + w1, f, r)
        if best is None:
            return None
        pred, _ = self._from(best[1])
        return _join(src, next(_walks(pred, best[2], 1)), dst)

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
        cost = lambda p: sum(self.router.weight(u, v) for u, v in zip(p, p[1:]))
        out = []
        for port in self.ports(src):
            lead = self._one(src, port)
            if lead is None:
                continue
            # NOTE: the port's own links out (not back the way the lead came), then the least
            # latency on; a way that comes back through a node of the lead is dropped.
            ways = [lead + rest for v in self.graph.successors(port) if v not in lead
                    for rest in (self._one(v, dst),) if rest is not None and not set(lead) & set(rest)]
            if ways:
                out.append(min(ways, key=cost))
        out.sort(key=cost)
        return out


def _walks(pred: dict, end: str, limit: int):
    """Up to ``limit`` node paths from the search's source to ``end`` (every predecessor of
    equal cost: all least-latency paths), in predecessor order."""
    stack = [(end, (end,))]
    while stack and limit > 0:
        node, tail = stack.pop()
        before = pred[node]
        if not before:
            limit -= 1
            yield tail
            continue
        for p in reversed(before):
            stack.append((p, (p,) + tail))


def _join(src: str, mid: tuple, dst: str) -> tuple:
    return ((src,) if mid[0] != src else ()) + mid + ((dst,) if mid[-1] != dst else ())
