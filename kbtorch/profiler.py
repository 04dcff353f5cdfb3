"""Human-readable latency reports: attribution by component kind and the hops of a route.

Kinds are the ``kind`` attributes of the topology's nodes and links (plus ``issue``, the
control processor's command-issue cost); times are reported in ns.
"""
from __future__ import annotations

from tabulate import tabulate

#: Friendly names of node and link kinds; an unknown kind is shown as itself.
KIND_NAMES = {
    "issue": "command issue", "cpu": "control processor", "scheduler": "PE scheduler",
    "dma": "DMA engine", "noc": "NoC link", "router": "NoC router", "ucie": "UCIe link",
    "ucie_phy": "UCIe PHY", "pcie": "PCIe link", "pcie_ep": "PCIe endpoint",
    "hbm": "HBM channel", "hbm_ctrl": "HBM controller", "hbm_port": "HBM port link",
    "tcm": "TCM", "gemm": "GEMM engine", "math": "vector math engine", "ipcq": "IPCQ",
    "sram": "SRAM channel", "sram_port": "SRAM port link", "ctrl": "control link",
}


def kind_name(kind: str) -> str:
    return KIND_NAMES.get(kind, kind)


def breakdown_ns(result) -> dict[str, float]:
    """``{kind: ns}`` of a run's latency, largest first."""
    items = sorted(result.breakdown().items(), key=lambda kv: (-kv[1], kv[0]))
    return {k: ps / 1000 for k, ps in items}


def breakdown_table(result, top: int | None = None) -> str:
    """Latency attribution of a run by component kind (ns and % of the latency), largest
    first; with ``top``, the rest is summed into one ``other`` row."""
    total = result.latency_ps / 1000
    items = list(breakdown_ns(result).items())
    if top is not None and len(items) > top:
        items = items[:top] + [("other", sum(ns for _, ns in items[top:]))]
    rows = [(kind_name(k), k, ns, 100 * ns / total if total else 0.0) for k, ns in items]
    rows.append(("total", "", total, 100.0 if total else 0.0))
    return tabulate(rows, headers=("component", "kind", "ns", "%"), floatfmt=("", "", ".3f", ".1f"))


def path_table(path, machine) -> str:
    """The hops of a route (a sequence of node names): each node with the link that enters it
    (kind, GB/s, propagation ns) and its switching overhead (ns)."""
    g = machine.graph
    rows = []
    for i, node in enumerate(path):
        d = g.nodes[node]
        if i == 0:
            link = ("", "", "")
        else:
            e = g.edges[path[i - 1], node]
            link = (e["kind"], f"{e['bw_gbps']:g}", f"{e['prop_ns']:g}")
        rows.append((i, node, d["kind"], *link, f"{d['overhead_ns']:g}"))
    return tabulate(rows, headers=("hop", "node", "kind", "link in", "GB/s", "prop ns", "switch ns"),
                    disable_numparse=True)
