"""Friendly names of the component kinds of topology files (node and link ``kind``s, plus
``issue``, the control processor's command-issue cost), for reports and the op stream."""
from __future__ import annotations

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
