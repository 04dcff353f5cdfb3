"""Hardware facts asked of a compiled machine: peaks, op costs, memories and capacities.

Everything here is read from the topology file (the component parameters on the graph's
nodes); no number describing hardware lives in code outside ``topology/`` and the files.
``MachineFacts`` is a mixin of :class:`~kbtorch.topology.machine.Machine` and needs its
``graph``, ``pes``, ``name`` and ``path``.
"""
from __future__ import annotations

import functools
from .. import state

#: Memory levels a PE addresses: its HBM (a slice of its own, or a memory shared by a
#: cluster or the whole die), the shared SRAM, and its TCM.
LEVELS = ("hbm", "sram", "tcm")
_MIB, _GIB = 1 << 20, 1 << 30


class MachineFacts:
    """Peaks per dtype, MATH costs, memory levels with capacities and burst sizes."""

    @functools.cached_property
    def multicast_nodes(self) -> frozenset:
        """Nodes that replicate a multicast payload where its routes part (``multicast = true``
        on their component); empty on a machine without multicast."""
        return frozenset(n for n, d in self.graph.nodes(data=True) if d["params"].get("multicast"))

    def engine_params(self, pe: int, role: str) -> dict:
        """The parameters of PE ``pe``'s engine that plays ``role`` (``gemm``, ``math``, ...)."""
        return self.graph.nodes[self.pes[pe].node(role)]["params"]

    def engine_tflops(self, pe: int, role: str, dtype: str) -> float:
        """TFLOP/s of one engine for ``dtype``; a ValueError names the dtypes it has."""
        rates = self.engine_params(pe, role).get("tflops", {})
        if dtype not in rates:
            raise ValueError(f"topology '{self.name}': the {role} engine of PE {pe} has no peak for dtype "
                             f"'{dtype}' (it has: {', '.join(rates) or 'none'})")
        return float(rates[dtype])

    def peak_tflops(self, dtype: str, pes=None, role: str = "gemm") -> float:
        """Summed TFLOP/s of the ``role`` engines of ``pes`` (default: every PE) for ``dtype``."""
        pes = range(len(self.pes)) if pes is None else pes
        return sum(self.engine_tflops(p, role, dtype) for p in pes)

    def dtypes(self, role: str = "gemm", pe: int = 0) -> tuple:
        """The dtypes an engine role has a peak for."""
        return tuple(self.engine_params(pe, role).get("tflops", {}))

    def math_flops(self, op: str, pe: int = 0) -> int:
        """FLOPs the MATH engine spends per element of vector op ``op`` (``flops_per_element``)."""
        table = self.engine_params(pe, "math").get("flops_per_element", {})
        if op not in table:
            raise ValueError(f"topology '{self.name}': the math engine has no cost for op '{op}' "
                             f"(flops_per_element has: {', '.join(table) or 'nothing'})")
        return int(table[op])

    def math_ops(self, pe: int = 0) -> tuple:
        return tuple(self.engine_params(pe, "math").get("flops_per_element", {}))

    def memory(self, pe: int, level: str) -> str | None:
        """The memory node PE ``pe`` addresses at ``level`` (None if it has none there)."""
        if level not in LEVELS:
            raise ValueError(f"unknown memory level '{level}' (expected one of {', '.join(LEVELS)})")
        info = self.pes[pe]
        return info.node("tcm") if level == "tcm" else getattr(info, level)

    def capacity(self, level: str, pe: int = 0) -> int:
        """Allocatable bytes of PE ``pe``'s memory at ``level`` (a TCM less its kernel scratch)."""
        node = self.memory(pe, level)
        if node is None:
            raise ValueError(f"topology '{self.name}': PE {pe} has no {level}")
        return self.node_capacity(node)

    @state.cache

    @functools.cache
    def node_capacity(self, node: str) -> int:
        """Allocatable bytes of memory node ``node``: ``capacity_gib``/``capacity_mib`` less ``scratch_mib``."""
        p = self.graph.nodes[node]["params"]
        if "capacity_gib" in p:
            total = round(p["capacity_gib"] * _GIB)
        elif "capacity_mib" in p:
            total = round(p["capacity_mib"] * _MIB)
        else:
            raise ValueError(f"topology '{self.name}': memory node '{node}' declares no capacity_gib or capacity_mib")
        return total - round(p.get("scratch_mib", 0) * _MIB)

    def burst_bytes(self, node: str) -> int:
        """Bytes of one access burst of memory node ``node`` (its interleaving granule)."""
        return int(self.graph.nodes[node]["params"]["burst_bytes"])

    def granule(self, node: str) -> int:
        """Bytes of one access of memory node ``node``: its burst (HBM, SRAM) or a flit (TCM)."""
        return self.flit_bytes if self.graph.nodes[node]["kind"] == "tcm" else self.burst_bytes(node)

    def span(self, node: str, nbytes: int, stride: int = 0) -> int:
        """Bytes of ``node`` that ``nbytes`` cover when consecutive accesses are ``stride``
        bytes apart (0: contiguous)."""
        if not stride:
            return nbytes
        granule = self.granule(node)
        return (-(-nbytes // granule) - 1) * stride + granule

    @state.cache

    @functools.cache
    def sharers(self, node: str) -> tuple:
        """The PEs whose HBM or SRAM is memory node ``node``."""
        return tuple(pe.id for pe in self.pes if node in (pe.hbm, pe.sram))

    @state.cache

    @functools.cache
    def hbm_port(self, pe: int) -> tuple[str, float, float]:
        """(controller, memory GB/s, controller uplink GB/s) of PE ``pe``'s HBM.

        The memory delivers the lesser of its channels and its port links; the controller is
        the transit node those links reach (a memory on the network directly is its own
        controller), and its links onward are shared by every memory behind it."""
        g, hbm = self.graph, self.pes[pe].hbm
        p = g.nodes[hbm]["params"]
        port = sum(d["bw_gbps"] for _, _, d in g.out_edges(hbm, data=True))
        own = min(p.get("channels", 1) * p["channel_gbps"], port)
        ctrl = next(iter(g.successors(hbm)))
        if g.nodes[ctrl]["kind"] != "hbm_ctrl":
            return hbm, own, own
        up = sum(g.edges[ctrl, v]["bw_gbps"] for v in g.successors(ctrl) if g.nodes[v]["transit"])
        return ctrl, own, up

    @state.cache

    @functools.cache
    def port_gbps(self, pe: int, role: str) -> float:
        """GB/s of the network port of PE ``pe``'s engine ``role``: the links into it from
        transit nodes (``dma_rd``: what it reads) or out of it to them (any other role)."""
        g, node = self.graph, self.pes[pe].node(role)
        edges = g.in_edges(node, data=True) if role == "dma_rd" else g.out_edges(node, data=True)
        return sum(d["bw_gbps"] for u, v, d in edges if g.nodes[u if role == "dma_rd" else v]["transit"])

    def head_ns(self, path) -> float:
        """Latency (ns) of one flit along ``path`` (a node sequence) with no contention."""
        return sum(self.router.weight(u, v) for u, v in zip(path, path[1:])) / 1000

    @state.cache

    @functools.cache
    def control_ps(self, pe: int) -> int:
        """Switching overheads (ps) before PE ``pe``'s first command reaches its engine, beside
        its issue: the control processor's at launch and the scheduler's."""
        g, info = self.graph, self.pes[pe]
        return g.nodes[info.node("cp")]["overhead_ps"] + g.nodes[info.node("sched")]["overhead_ps"]

    @state.cache

    @functools.cache
    def read_trip_ns(self, pe: int) -> float:
        """Head latency (ns) of a read of PE ``pe``'s HBM: the request from its DMA read engine
        to the memory, and the first flit of data back into its TCM."""
        info = self.pes[pe]
        return self.head_ns(self.route(info.node("dma_rd"), info.hbm)) + \
            self.head_ns(self.route(info.hbm, info.node("dma_rd")) + (info.node("tcm"),))

    @state.cache

    @functools.cache
    def pe_trip_ns(self, a: int, b: int) -> float:
        """Head latency (ns) from PE ``a``'s TCM to PE ``b``'s and back."""
        def way(s, d):
            src, dst = self.pes[s], self.pes[d]
            return self.head_ns((src.node("tcm"),) + self.route(src.node("dma_wr"), dst.node("dma_rd")) +
                                (dst.node("tcm"),))
        return way(a, b) + way(b, a) if a != b else 0.0

    def hbm_gbps(self, pes) -> float:
        """Aggregate HBM bandwidth (GB/s) the memories of ``pes`` can deliver together
        (a memory shared by several of them counts once)."""
        ctrls: dict = {}
        for node in dict.fromkeys(self.pes[pe].hbm for pe in pes):
            ctrl, own, up = self.hbm_port(self.sharers(node)[0])
            ctrls.setdefault(ctrl, [0.0, up])[0] += own
        return sum(min(own, up) for own, up in ctrls.values())
